"""A stage logging JSON names a logging config for the native SGLang processes it starts
(``SGLANG_LOGGING_CONFIG_PATH``, read by native's ``configure_logger``); applied in such a
process, it writes the stage's JSON lines at the stage's level. The native tier runs native's
own ``configure_logger`` on it (tests/native/test_native_logging.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: A stage process's logging, then a child started as native starts its processes (spawn),
#: which applies the config file named in its environment as native does.
CHILD = """
import json, logging, logging.config, multiprocessing, os, sys

def native_child():
    with open(os.environ["SGLANG_LOGGING_CONFIG_PATH"], encoding="utf-8") as f:
        logging.config.dictConfig(json.load(f))
    log = logging.getLogger("sglang.srt.managers.scheduler")
    log.info("Prefill batch. #new-seq: 1")
    log.debug("a debug line")

if __name__ == "__main__":
    from sglang_omni.runtime.log_format import configure_logging
    configure_logging(sys.argv[1], sys.argv[2], stage="reasoner")
    if "SGLANG_LOGGING_CONFIG_PATH" not in os.environ:
        sys.exit(7)
    child = multiprocessing.get_context("spawn").Process(target=native_child)
    child.start()
    child.join()
    sys.exit(child.exitcode)
"""


def run_stage(tmp_path, level: str, fmt: str, config: str | None = None  # noqa: ANN001
              ) -> subprocess.CompletedProcess[str]:
    """The stage script's run; ``config``: the config the server's environment names."""
    script = tmp_path / "stage.py"
    script.write_text(CHILD, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_LOGGING_CONFIG_PATH"}
    if config is not None:
        env["SGLANG_LOGGING_CONFIG_PATH"] = config
    return subprocess.run([sys.executable, str(script), level, fmt], capture_output=True,
                          text=True, timeout=60, cwd=str(tmp_path), env=env)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_native_processes_of_a_json_stage_write_its_json_lines(tmp_path, level: str) -> None:  # noqa: ANN001
    done = run_stage(tmp_path, level, "json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["level"], r["logger"], r["stage"], r["message"]) for r in lines][:1] == [
        ("INFO", "sglang.srt.managers.scheduler", "reasoner", "Prefill batch. #new-seq: 1")]
    assert [r["message"] for r in lines[1:]] == (["a debug line"] if level == "debug" else [])


def test_a_text_stage_leaves_native_its_own_format(tmp_path) -> None:  # noqa: ANN001
    done = run_stage(tmp_path, "info", "text")
    assert done.returncode == 7, done.stderr  # no config named: native keeps its format


def test_a_config_the_environment_names_is_kept(tmp_path) -> None:  # noqa: ANN001
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "MINE %(levelname)s %(message)s"}},
        "handlers": {"err": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"handlers": ["err"], "level": "INFO"}}), encoding="utf-8")
    done = run_stage(tmp_path, "info", "json", str(mine))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["MINE INFO Prefill batch. #new-seq: 1"]
