"""Item 4 of the native chat stage: warmup before ready, aborts, and native process lifecycle,
over HTTP with the scripted Reasoner. ``factory.native_lifecycle`` makes the scripted stage
behave like a native one: its ``children`` stand in for native SGLang's scheduler and
detokenizer (the native backend's own watch is tested in ``tests/native``)."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time

import httpx
import psutil
import pytest

from sglang_omni.engines.native.lifecycle import running
from tests.chat.kit import CHAT, TEXT_ONLY, chat, metric, say, sse_events
from tests.kit import leave_when, wait_until
from tests.server import Server

SLOW = {"delay_s": 30}
NATIVE_LIKE = [*TEXT_ONLY, "--reasoner.factory.children", "2",
               "--reasoner.factory.native_lifecycle", "true"]


def stage_children(server: Server) -> list[psutil.Process]:
    return psutil.Process(server.stage_pid("reasoner")).children()


def gone(procs: list[psutil.Process]) -> bool:
    return not any(running(p) for p in procs)


# --- warmup -----------------------------------------------------------------------------------
def test_warmup_is_answered_before_the_stage_is_ready() -> None:
    with Server(*TEXT_ONLY) as server:
        log = server.log()
        assert log.index("warmup request answered before ready") < log.index(
            "ready (backend scripted)")


def test_skip_server_warmup_turns_it_off() -> None:
    with Server(*TEXT_ONLY, "--reasoner.engine.skip_server_warmup", "true") as server:
        log = server.log()
        assert "warmup skipped (engine.skip_server_warmup)" in log
        assert "warmup request answered" not in log


# --- aborts -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():  # noqa: ANN201
    # the slow media host below listens on loopback: allowlisted (no flags refuse loopback)
    with Server(*TEXT_ONLY, "--allowed-media-domain", "127.0.0.1") as srv:
        yield srv


def test_closed_stream_aborts_at_once(server: Server) -> None:
    before = metric(server, "reasoner", "aborted")
    with httpx.stream("POST", f"{server.url}{CHAT}",
                      json={"stream": True, "messages": say("never", **SLOW)}) as resp:
        lines = resp.iter_lines()
        assert resp.status_code == 200 and next(lines).startswith("data: ")
    # the close ends the 30 s turn: aborted, not completed (and long before it would be)
    assert wait_until(lambda: metric(server, "reasoner", "aborted") == before + 1, 10)
    assert metric(server, "reasoner", "completed") == 0


def test_client_gone_aborts_a_non_streaming_request(server: Server) -> None:
    before = metric(server, "reasoner", "aborted")
    submitted = metric(server, "reasoner", "submitted", default=0)
    leave_when(server, CHAT, {"messages": say("never", **SLOW)},  # once its turn runs
               lambda: metric(server, "reasoner", "submitted", default=0) == submitted + 1)
    assert wait_until(lambda: metric(server, "reasoner", "aborted") == before + 1, 10)


def test_client_gone_before_the_stream_starts_aborts(server: Server) -> None:
    """A streaming request whose client leaves before the stage accepted it (media still
    loading, here a slow local media host) is aborted too."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections but never answers: the fetch hangs
    try:
        before = metric(server, "reasoner", "aborted")
        content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {
            "url": f"http://127.0.0.1:{listener.getsockname()[1]}/slow.png"}}]
        # the client leaves once the fetch has connected to the host (the media loading)
        leave_when(server, CHAT, {"stream": True, "messages": [
            {"role": "user", "content": content}]},
            lambda: bool(select.select([listener], [], [], 0)[0]))
        assert wait_until(lambda: metric(server, "reasoner", "aborted") == before + 1, 10)
    finally:
        listener.close()


# --- native processes -------------------------------------------------------------------------
def test_native_child_failure_stops_the_stage_and_the_server() -> None:
    server = Server(*NATIVE_LIKE)
    try:
        stage = psutil.Process(server.stage_pid("reasoner"))
        children = stage_children(server)
        assert len(children) == 2
        tree = server.descendants()
        result: dict = {}

        def client() -> None:
            result["resp"] = httpx.post(f"{server.url}{CHAT}", timeout=30, json={
                "stream": True, "messages": say("never", **SLOW)})

        thread = threading.Thread(target=client)
        thread.start()
        assert wait_until(lambda: metric(server, "reasoner", "submitted") >= 1)
        children[0].kill()
        thread.join(30)  # answered with the child's exit, not after the 30 s turn
        events = sse_events(result["resp"].text)
        error = events[-2]["error"]
        assert error["code"] == 500
        assert f"the scripted native child process {children[0].pid} exited" in error["message"]
        assert server.proc.wait(30) == 1  # the server stopped on its own, non-zero
        log = server.log()
        assert "the reasoner stage failed: the scripted native child process" in log
        assert "sgl-omni: stopped: the reasoner stage exited" in log
        assert wait_until(lambda: gone([*tree, stage]), 10), "processes left behind"
    finally:
        server.stop()


def test_killed_native_stage_stops_the_server_and_its_children() -> None:
    server = Server(*NATIVE_LIKE)
    try:
        stage = server.stage_pid("reasoner")
        children = stage_children(server)
        os.kill(stage, signal.SIGKILL)
        assert server.proc.wait(30) == 1
        assert "the reasoner stage exited (exit code -9)" in server.log()
        assert wait_until(lambda: gone(children), 10)
    finally:
        server.stop()


def test_scripted_stage_without_native_lifecycle_keeps_serving_when_a_child_exits() -> None:
    with Server(*TEXT_ONLY, "--reasoner.factory.children", "1") as server:
        stage_children(server)[0].kill()
        time.sleep(1.0)  # longer than the watch's poll: nothing may react
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert chat(server, {"messages": say("still here")}).status_code == 200
        assert server.proc.poll() is None

