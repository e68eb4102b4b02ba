"""The native tier: native SGLang's own ``configure_logger`` (0.5.23) under a stage.

* Starting native in the stage process (its ``Engine`` runs ``configure_logger``, which
  replaces the root logger's handlers) leaves the stage's logging as it was: the stage's own
  lines keep ``--log-format``.
* In a process native starts under a stage that logs JSON, ``configure_logger`` reads the
  config the stage names and writes the stage's JSON lines.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sglang", reason="the native tier needs the pinned sglang (native extra)")

from sglang.test.test_utils import maybe_stub_sgl_kernel  # noqa: E402

maybe_stub_sgl_kernel()

from sglang.srt.utils.common import configure_logger  # noqa: E402
from sglang.test.test_utils import published_topology  # noqa: E402

from sglang_omni.runtime.log_format import JsonFormatter  # noqa: E402
from tests.native.fakes import FakeEngine  # noqa: E402
from tests.native.test_native_reasoner import make  # noqa: E402

pytestmark = pytest.mark.native


@pytest.fixture
def root_logging() -> Iterator[io.StringIO]:
    """The root logger writing the stage's JSON lines to a buffer; put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter({"stage": "reasoner"}))
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_starting_native_keeps_the_stage_log_format(root_logging: io.StringIO) -> None:
    def native_engine(kwargs: dict[str, Any]) -> FakeEngine:
        configure_logger(SimpleNamespace(log_level="warning"))  # as native's Engine does
        return FakeEngine(kwargs)

    reasoner = make()
    reasoner._engine_factory = native_engine
    with published_topology():
        asyncio.run(reasoner.start())
    logging.getLogger("sglang_omni.native.reasoner").info("after the engine started")
    lines = [json.loads(line) for line in root_logging.getvalue().splitlines()]
    assert {"level": "INFO", "logger": "sglang_omni.native.reasoner", "stage": "reasoner",
            "message": "after the engine started"}.items() <= lines[-1].items()
    assert logging.getLogger().level == logging.INFO


NATIVE_CHILD = """
import logging, multiprocessing, sys
from types import SimpleNamespace

def scheduler():
    from sglang.srt.utils.common import configure_logger
    configure_logger(SimpleNamespace(log_level="info"), prefix=" TP0")  # native's own call
    log = logging.getLogger("sglang.srt.managers.scheduler")
    log.info("Prefill batch. #new-seq: 1")
    log.debug("a debug line")

if __name__ == "__main__":
    from sglang_omni.runtime.log_format import configure_logging
    configure_logging("info", "json", stage="reasoner")
    child = multiprocessing.get_context("spawn").Process(target=scheduler)
    child.start()
    child.join()
    sys.exit(child.exitcode)
"""


def test_native_processes_of_a_json_stage_write_its_json_lines(tmp_path: Path) -> None:
    script = tmp_path / "stage.py"
    script.write_text(NATIVE_CHILD, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    records = []
    for line in done.stderr.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # Python's own warnings, say: not log records
            assert "Prefill batch" not in line, line
    mine = [r for r in records if r.get("logger") == "sglang.srt.managers.scheduler"]
    assert [(r["level"], r["stage"], r["message"]) for r in mine] == [
        ("INFO", "reasoner", "Prefill batch. #new-seq: 1")]
