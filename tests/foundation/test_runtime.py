"""Stage processes over real HTTP: handshake, abort, death of a stage, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import psutil
import pytest

from tests.kit import leave_when, metric, wait_until
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server
from tests.supervision.kit import failed_at_exit

SLOW_SCRIPT = '<omni-script>[{"action": "final", "text": "late", "delay_s": 30}]</omni-script>'


def test_ready_handshake_health_and_models() -> None:
    with Server(*SCRIPTED_UMM) as server:
        health = httpx.get(f"{server.url}/health").json()
        assert health["status"] == "ok"
        assert set(health["stages"]) == {"generation", "reasoner"}
        assert all(s["status"] == "ready" and s["pid"] for s in health["stages"].values())
        models = httpx.get(f"{server.url}/v1/models").json()
        assert models["data"][0]["pipeline"] == "Cosmos3UMMPipelineConfig"


def test_startup_timeout_exits_nonzero_naming_the_key() -> None:
    server = Server(*SCRIPTED_CHAT, "--reasoner.factory.startup_timeout_s", "0.001",
                    wait_ready=False)
    try:
        assert server.proc.wait(60) != 0
        assert "raise stages.reasoner.factory.startup_timeout_s" in server.log()
    finally:
        server.stop()


def test_stage_startup_failure_exits_nonzero() -> None:
    # A model_path that is no folder fails the hf stage before it imports torch (beside two
    # CPU burners and the hf tests, that import alone took over 60 s).
    server = Server(*SCRIPTED_CHAT, "--reasoner.factory.backend", "hf", "--model-path", "/none",
                    wait_ready=False)
    try:
        assert server.proc.wait(60) != 0, server.log()
        log = server.log()
        assert "the reasoner stage failed to start" in log
        assert "model_path '/none' is not one; pass --model-path" in log
        assert "Repo id" not in log  # not the hub library's word for a mistyped path
        assert "restart" not in log  # the server gives up: no restart is planned or logged
    finally:
        server.stop()


def test_request_id_reuse_refused() -> None:
    with Server(*SCRIPTED_CHAT) as server:
        body = {"rid": "abc", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{server.url}/v1/chat/completions", json=body).status_code == 200
        again = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        assert again.status_code == 400
        error = again.json()["error"]
        assert error["code"] == 400 and error["type"] == "invalid_request_error"
        assert "fresh request ID" in error["message"]


def test_closed_stream_aborts_the_stage_job() -> None:
    with Server(*SCRIPTED_CHAT) as server:
        body = {"stream": True, "messages": [{"role": "user", "content": SLOW_SCRIPT}]}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # the role chunk: the job is running on the stage
        wait_until(lambda: metric(server, "reasoner", "aborted") >= 1, timeout=10)
        assert metric(server, "reasoner", "aborted") == 1
        assert metric(server, "reasoner", "completed") == 0


def test_disconnected_non_streaming_request_aborts() -> None:
    with Server(*SCRIPTED_CHAT) as server:
        body = {"messages": [{"role": "user", "content": SLOW_SCRIPT}]}
        leave_when(server, "/v1/chat/completions", body,  # once its 30 s turn runs
                   lambda: metric(server, "reasoner", "submitted", default=0) >= 1)
        wait_until(lambda: metric(server, "reasoner", "aborted") >= 1, timeout=10)
        assert metric(server, "reasoner", "aborted") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_kill_9_fails_in_flight_request_fast(stream: bool) -> None:
    # no restart budget: the stage stays down (tests/supervision covers restarts)
    with Server(*SCRIPTED_CHAT, "--reasoner.factory.max_restarts", "0") as server:
        pid = server.stage_pid("reasoner")
        result: dict = {}
        streaming = threading.Event()  # the stream's first event reached the client

        def client() -> None:
            body = {"stream": stream, "messages": [{"role": "user", "content": SLOW_SCRIPT}]}
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                              timeout=30) as resp:
                lines = []
                for line in resp.iter_lines():
                    lines.append(line)
                    if line.startswith("data: "):
                        streaming.set()
                result["resp"], result["text"] = resp, "\n".join(lines)

        thread = threading.Thread(target=client)
        thread.start()
        assert wait_until(lambda: metric(server, "reasoner", "submitted", default=0) >= 1)
        if stream:  # a stage that dies before the stream starts is answered as plain JSON
            assert streaming.wait(30)
        log_from = len(server.log())
        os.kill(pid, signal.SIGKILL)
        thread.join(30)
        # failed with the exit, not after the 30 s turn
        assert failed_at_exit(server, "reasoner", log_from) == [1]
        resp, text = result["resp"], result["text"]
        if stream:
            events = [json.loads(line[6:]) for line in text.splitlines()
                      if line.startswith("data: {")]
            assert events[-1]["error"]["code"] == 500
            assert "reasoner stage process exited" in events[-1]["error"]["message"]
        else:
            assert resp.status_code == 500
            assert "reasoner stage process exited" in json.loads(text)["error"]["message"]
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503
        assert health.json()["stages"]["reasoner"]["status"] == "exited"
        after = httpx.post(f"{server.url}/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "hi"}]})
        assert after.status_code == 503


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_leaves_no_process(sig: int) -> None:
    server = Server(*SCRIPTED_UMM, "--reasoner.factory.children", "2",
                    "--generation.factory.children", "1")
    try:
        tree = server.descendants()
        # two stages, plus three idle children standing in for native workers
        assert len([p for p in tree if p.ppid() == server.proc.pid]) >= 2
        assert len(tree) >= 5
        pids = [p.pid for p in tree] + [server.proc.pid]
        server.proc.send_signal(sig)
        assert server.proc.wait(30) == 0  # a stop asked for, done: no signal status, no traceback
        assert "Traceback" not in server.log()
        gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                        timeout=10)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"left behind: {alive}"
    finally:
        server.stop()
