"""Every thread a stage process starts is stopped and joined as the stage exits (issue 37): the
reader and server watch, the video encoders, the engine's own. A stage logs, as it exits, the
threads still running besides its main thread; after a server stop that follows finished,
streamed and abandoned video generations, each stage says none is left."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.runtime.stage.handle import StageHandle
from tests.generation.kit import native_server
from tests.kit import script
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import SMALL, final, post_generate, video

NONE_LEFT = "exiting: no thread left besides the main thread"
GEN = {"stage_params": {"generation": SMALL}}


def test_a_stopped_stage_leaves_no_thread_besides_its_main_thread() -> None:
    server = Server(*SCRIPTED_UMM)
    try:
        done = post_generate(server, {"prompt": script(video("a cat"), final("done")), **GEN})
        assert done.status_code == 200, done.text
        # a client that leaves a streamed video while it is generated (its job is aborted)
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", f"{server.url}/generate", json={
                    "prompt": script(video("!sleep=30 slow")), "stream": True,
                    "include_progress": True, **GEN}) as stream:
            for line in stream.iter_lines():
                if '"stage": "generation"' in line:
                    break
        assert stop_and_count_clean_exits(server) == 2
    finally:
        server.stop()


def test_a_stopped_native_generation_stage_leaves_no_thread(tmp_path: Path) -> None:
    """The native engine's threads (its worker watch, one per native call) go too."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    server = native_server(log_dir, tmp_path / "out")
    try:
        resp = httpx.post(f"{server.url}/v1/images/generations", timeout=60, json={
            "prompt": "a red cube", "size": "48x32", "num_inference_steps": 2})
        assert resp.status_code == 200, resp.text
        assert stop_and_count_clean_exits(server) == 1
    finally:
        server.stop()


def stop_and_count_clean_exits(server: Server) -> int:
    """Stop ``server`` (SIGTERM) and wait for it; how many of its stages exited with no thread
    left (AssertionError, with the log, when a stage left one running)."""
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(60)
    log = server.log()
    assert "thread(s) still running" not in log and "did not stop within" not in log, log
    return sum(NONE_LEFT in line for line in log.splitlines())


def test_without_a_pidfd_the_servers_exit_watch_thread_is_joined_at_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel has no pidfd, a thread of the server joins each stage process; the
    stage's stop joins it too."""
    def no_pidfd(_pid: int) -> int:
        raise OSError("no pidfd here")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    spec = EngineSpec(stage="reasoner", role="reasoner", backend="scripted", model_path=None,
                      gpu=None, gpu_memory_fraction=None, factory={},
                      engine={"skip_server_warmup": True})

    async def main() -> tuple[list[str], list[str]]:
        handle = StageHandle(spec, startup_timeout_s=60.0, log_level="warning")
        await handle.start()
        running = watches()
        await handle.stop()
        return running, watches()

    running, left = asyncio.run(main())
    assert running == ["sgl-omni-reasoner-watch"] and left == []


def watches() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-watch")]
