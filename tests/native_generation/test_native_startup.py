"""Startup of the native generation stage with the real driver over the pinned sglang (native
tier): the checks before the model loads. There is no GPU or checkpoint here, so a start that
passes them fails later, loading the model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sglang")

from tests.server import SCRIPTED_GENERATION, Server  # noqa: E402

pytestmark = pytest.mark.native


def start_native(tmp_path: Path, *flags: str, env: dict[str, str]) -> str:
    """Start a direct generation server with the native backend; its log once it exited."""
    server = Server(*SCRIPTED_GENERATION, "--generation.gpu", "0",
                    "--generation.factory.backend", "native", "--model-path",
                    str(tmp_path / "no-checkpoint"), "--generation.factory.output_dir",
                    str(tmp_path / "out"), *flags, wait_ready=False,
                    env={"CUDA_VISIBLE_DEVICES": "0", **env})
    try:
        assert server.proc.wait(600) != 0
        return server.log()
    finally:
        server.stop()


def test_sglang_plugins_without_our_name_stops_startup(tmp_path: Path) -> None:
    log = start_native(tmp_path, env={"SGLANG_PLUGINS": "some_other_plugin"})
    assert "SGLANG_PLUGINS is set to 'some_other_plugin', which does not list " \
           "omni_generation_cancellation" in log
    assert "the generation stage failed to start" in log


def test_more_than_one_native_gpu_warns_before_loading(tmp_path: Path) -> None:
    log = start_native(tmp_path, "--generation.engine.num_gpus", "2",
                       env={"SGLANG_PLUGINS": ""})
    assert "WARNING generation cancellation is off: generation uses 2 native GPUs" in log
    assert "Cosmos3 guardrails are OFF" in log  # cosmos-guardrail is not in the tier's venv
