"""Stage supervision over HTTP: a stage killed (kill -9) or frozen (SIGSTOP) with a request in
flight fails that request at once with a clear error (the server's log counts it among the
requests that failed with the exit), /health says so (503), the stage is
restarted with no person, the next request succeeds, no process is left behind and /metrics
counts the restart. A stage past its restart budget cools down and comes back by itself; with
restarts off (max_restarts 0) it leaves the server unhealthy."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

from tests.kit import wait_until
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.supervision.kit import (
    HTTP,
    InFlight,
    assert_gone,
    failed_at_exit,
    fast,
    health,
    process_tree,
    restarts,
    signal_stage,
    wait_health,
    wait_jobs,
)
from tests.umm.kit import (
    final,
    image,
    only,
    parse_sse,
    post_generate,
    script,
    stream_generate,
)

SMALL = {"width": 32, "height": 32}
SLOW_TURN = script(final("late", delay_s=30))
SLOW_GENERATION = script(image("!sleep=30 slow"), final("never"))
CHAT_SLOW = '<omni-script>[{"action": "final", "text": "late", "delay_s": 30}]</omni-script>'


def chat_body(content: str, stream: bool = False) -> dict:
    return {"stream": stream, "messages": [{"role": "user", "content": content}]}


def post_chat(server: Server, body: dict) -> tuple[int, str]:
    resp = HTTP.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    return resp.status_code, resp.text


def sse_error(raw: str) -> dict:
    """The error of a stream that must end with an error event, then [DONE]."""
    events = parse_sse(raw)
    assert events[-1] == ("message", "[DONE]"), events
    errors = [data for _, data in events if isinstance(data, dict) and "error" in data]
    assert errors, events
    return errors[-1]["error"]


def recovers(server: Server, stage: str, old_tree: set[psutil.Process], count: int) -> None:
    """The stage comes back by itself; the old process tree is gone, as many processes run
    as before, and /metrics counts ``count`` restarts of the stage."""
    body = wait_health(server, "ok")
    assert body["stages"][stage]["restarts"] == count
    assert restarts(server, stage) == count
    assert_gone(old_tree - process_tree(server))
    assert len(process_tree(server)) == len(old_tree)


def refused_while_restarting(server: Server, stage: str) -> None:
    resp = health(server)
    assert resp.status_code == 503, resp.text
    assert resp.json()["status"] in ("restarting", "stalled")
    assert resp.json()["stages"][stage]["status"] in ("restarting", "stalled")
    assert resp.headers.get("retry-after")


# --- interleaved ---------------------------------------------------------------------------------
def test_kill_9_reasoner_mid_turn_fails_fast_then_restarts() -> None:
    with Server(*SCRIPTED_UMM, "--reasoner.factory.children", "1",
                *fast("reasoner", "generation")) as server:
        tree = process_tree(server)
        flight = InFlight(lambda: post_generate(server, {"prompt": SLOW_TURN}))
        wait_jobs(server, "reasoner", 1)
        _, log_from = signal_stage(server, "reasoner", signal.SIGKILL)
        resp = flight.wait()
        assert failed_at_exit(server, "reasoner", log_from) == [1]
        assert resp.status_code == 500, resp.text
        error = resp.json()["error"]
        assert error["type"] == "server_error"
        assert "reasoner stage process exited" in error["message"]
        assert "restarting" in error["message"]
        refused_while_restarting(server, "reasoner")
        again = post_generate(server, {"prompt": script(final("x"))})  # refused, told to retry
        assert again.status_code == 503, again.text
        assert "restarting" in again.json()["error"]["message"]
        assert again.headers.get("retry-after")
        recovers(server, "reasoner", tree, 1)
        ok = post_generate(server, {"prompt": script(final("back"))})
        assert ok.status_code == 200, ok.text


def test_kill_9_generation_mid_stream_fails_fast_then_restarts() -> None:
    with Server(*SCRIPTED_UMM, *fast("reasoner", "generation")) as server:
        tree = process_tree(server)
        body = {"prompt": SLOW_GENERATION, "stage_params": {"generation": SMALL}}
        flight = InFlight(lambda: stream_generate(server, body))
        wait_jobs(server, "generation", 1)
        queued = InFlight(lambda: post_generate(server, body))  # waits in the planner's queue
        wait_jobs(server, "reasoner", 2)
        _, log_from = signal_stage(server, "generation", signal.SIGKILL)
        status, events = flight.wait()
        resp = queued.wait()
        assert failed_at_exit(server, "generation", log_from) == [2]  # the queued one too
        assert resp.status_code == 500, resp.text
        assert "generation stage process exited" in resp.json()["error"]["message"]
        assert status == 200
        assert events[-1] == ("message", "[DONE]"), events
        error = only(events, "error")
        assert error["code"] == 500 and "generation stage process exited" in error["message"]
        refused_while_restarting(server, "generation")
        recovers(server, "generation", tree, 1)
        # the planner kept nothing of the failed requests: generations run again
        for _ in range(2):
            ok = post_generate(server, {"prompt": script(image("p"), final("done")),
                                        "stage_params": {"generation": SMALL}})
            assert ok.status_code == 200, ok.text


def test_reasoner_death_fails_generating_and_queued_requests_at_once() -> None:
    """Defect 7: requests running or queued for a generation fail when the Reasoner dies, not
    at their next Reasoner turn."""
    with Server(*SCRIPTED_UMM, *fast("reasoner", "generation")) as server:
        body = {"prompt": SLOW_GENERATION, "stage_params": {"generation": SMALL}}
        running = InFlight(lambda: post_generate(server, body))
        wait_jobs(server, "generation", 1)
        queued = InFlight(lambda: stream_generate(server, body))
        wait_jobs(server, "reasoner", 2)  # its first turn ran; it waits for the generation
        _, log_from = signal_stage(server, "reasoner", signal.SIGKILL)
        resp = running.wait()
        status, events = queued.wait()
        assert failed_at_exit(server, "reasoner", log_from) == [2]  # both, at the exit
        assert resp.status_code == 500, resp.text
        assert "reasoner stage process exited" in resp.json()["error"]["message"]
        error = only(events, "error")
        assert error["code"] == 500 and "reasoner stage process exited" in error["message"]
        wait_health(server, "ok")
        ok = post_generate(server, {"prompt": script(image("p"), final("done")),
                                    "stage_params": {"generation": SMALL}})
        assert ok.status_code == 200, ok.text


def test_frozen_generation_is_reported_failed_and_restarted() -> None:
    """Defect 9: a SIGSTOPped stage stops answering its heartbeat: /health says so, its
    request fails, the frozen process is killed and the stage restarted."""
    with Server(*SCRIPTED_UMM, "--generation.factory.children", "1",
                *fast("reasoner", "generation", stall_s=1.0)) as server:
        tree = process_tree(server)
        body = {"prompt": SLOW_GENERATION, "stage_params": {"generation": SMALL}}
        flight = InFlight(lambda: post_generate(server, body))
        wait_jobs(server, "generation", 1)
        pid, log_from = signal_stage(server, "generation", signal.SIGSTOP)
        try:
            resp = flight.wait()
            assert failed_at_exit(server, "generation", log_from) == [1]
            assert resp.status_code == 500, resp.text
            assert "generation stage stopped answering" in resp.json()["error"]["message"]
            refused_while_restarting(server, "generation")
            recovers(server, "generation", tree, 1)
        finally:
            signal_stage_if_alive(pid)
        ok = post_generate(server, {"prompt": script(image("p"), final("done")),
                                    "stage_params": {"generation": SMALL}})
        assert ok.status_code == 200, ok.text


def signal_stage_if_alive(pid: int) -> None:
    """Let a stopped stage go on (when the test failed before it was killed)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


# --- text-only chat ------------------------------------------------------------------------------
def test_chat_reasoner_killed_then_frozen_restarts_each_time() -> None:
    with Server(*SCRIPTED_CHAT, *fast("reasoner", stall_s=1.0)) as server:
        tree = process_tree(server)
        flight = InFlight(lambda: post_chat(server, chat_body(CHAT_SLOW, stream=True)))
        wait_jobs(server, "reasoner", 1)
        _, log_from = signal_stage(server, "reasoner", signal.SIGKILL)
        status, raw = flight.wait()
        assert failed_at_exit(server, "reasoner", log_from) == [1]
        assert status == 200
        error = sse_error(raw)
        assert error["code"] == 500 and "reasoner stage process exited" in error["message"]
        recovers(server, "reasoner", tree, 1)
        assert post_chat(server, chat_body("hi"))[0] == 200

        tree = process_tree(server)
        flight = InFlight(lambda: post_chat(server, chat_body(CHAT_SLOW)))
        wait_jobs(server, "reasoner", 2)
        pid, log_from = signal_stage(server, "reasoner", signal.SIGSTOP)
        try:
            status, raw = flight.wait()
            assert failed_at_exit(server, "reasoner", log_from) == [1]
            assert status == 500, raw
            assert "reasoner stage stopped answering" in json.loads(raw)["error"]["message"]
            refused_while_restarting(server, "reasoner")
            recovers(server, "reasoner", tree, 2)
        finally:
            signal_stage_if_alive(pid)
        assert post_chat(server, chat_body("hi"))[0] == 200


def test_a_spent_restart_budget_cools_down_then_recovers() -> None:
    """Past max_restarts within restart_window_s the stage waits (restarting: 503 with
    Retry-After, not unhealthy) until its oldest restart leaves the window, then comes back by
    itself: a handful of faults cannot leave the server down for good. During the cool-down
    /health says when the stage restarts (restart_in_s) and every 503 tells the client to come
    back then (Retry-After), not after the server's fixed retry_after_s."""
    with Server(*SCRIPTED_CHAT, *fast("reasoner", restarts=1),
                "--reasoner.factory.restart_window_s", "30",
                "--server.retry_after_s", "1") as server:
        signal_stage(server, "reasoner", signal.SIGKILL)
        wait_health(server, "restarting")
        wait_health(server, "ok")
        assert restarts(server, "reasoner") == 1
        signal_stage(server, "reasoner", signal.SIGKILL)
        assert wait_until(lambda: "restart budget is spent" in server.log(), timeout=30)
        resp = health(server)
        assert resp.status_code == 503 and resp.json()["status"] == "restarting", resp.text
        restart_in = resp.json()["stages"]["reasoner"]["restart_in_s"]
        assert restart_in > 1, resp.text  # the rest of a 30 s window, not retry_after_s
        assert int(resp.headers["Retry-After"]) == math.ceil(restart_in)
        refused = HTTP.post(f"{server.url}/v1/chat/completions", json=chat_body("hi"),
                            timeout=60)
        assert refused.status_code == 503
        assert 1 <= int(refused.headers["Retry-After"]) <= math.ceil(restart_in)
        assert "restarting" in refused.json()["error"]["message"]
        assert health(server).json()["stages"]["reasoner"]["restart_in_s"] <= restart_in
        assert restarts(server, "reasoner") == 1  # cooling down: no restart yet
        body = wait_health(server, "ok", timeout=90)
        assert body["stages"]["reasoner"]["restarts"] == 2
        assert post_chat(server, chat_body("hi"))[0] == 200
        # and again: the budget keeps recovering, every time
        signal_stage(server, "reasoner", signal.SIGKILL)
        wait_health(server, "restarting")
        assert wait_health(server, "ok", timeout=90)["stages"]["reasoner"]["restarts"] == 3
        assert post_chat(server, chat_body("hi"))[0] == 200


def test_max_restarts_0_leaves_the_server_unhealthy() -> None:
    with Server(*SCRIPTED_CHAT, *fast("reasoner", restarts=0)) as server:
        signal_stage(server, "reasoner", signal.SIGKILL)
        body = wait_health(server, "unhealthy")
        assert body["stages"]["reasoner"]["status"] == "exited"
        resp = health(server)
        assert resp.status_code == 503 and resp.json()["status"] == "unhealthy"
        # the server will not come back by itself: nothing tells a client to retry it
        assert "Retry-After" not in resp.headers
        refused = HTTP.post(f"{server.url}/v1/chat/completions", json=chat_body("hi"),
                            timeout=60)
        assert refused.status_code == 503
        assert "needs a restart" in refused.json()["error"]["message"]
        assert "Retry-After" not in refused.headers
        assert restarts(server, "reasoner") == 0
        assert "max_restarts is 0" in server.log()


# --- direct generation ---------------------------------------------------------------------------
def test_direct_generation_stage_killed_fails_fast_then_restarts() -> None:
    with Server(*SCRIPTED_GENERATION, *fast("generation")) as server:
        tree = process_tree(server)
        flight = InFlight(lambda: HTTP.post(f"{server.url}/v1/images/generations", json={
            "prompt": "!sleep=30 cube", "size": "32x32"}, timeout=60))
        wait_jobs(server, "generation", 1)
        _, log_from = signal_stage(server, "generation", signal.SIGKILL)
        resp = flight.wait()
        assert failed_at_exit(server, "generation", log_from) == [1]
        assert resp.status_code == 500, resp.text
        assert "generation stage process exited" in resp.json()["error"]["message"]
        recovers(server, "generation", tree, 1)
        ok = HTTP.post(f"{server.url}/v1/images/generations",
                       json={"prompt": "cube", "size": "32x32"}, timeout=60)
        assert ok.status_code == 200, ok.text


def test_a_killed_stage_leaves_no_temporary_files(tmp_path) -> None:  # noqa: ANN001
    """Each stage process keeps its temporary files (a request's fetched media) in a folder of
    its own, which the server removes once the process is gone, kill -9 included (the process
    itself can then clean nothing). Text-only chat's Reasoner fetches its chat media itself (an
    interleaved request's are fetched by the server, once per request)."""
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # headers now, the body never (until the test ends)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            release.wait(60)

    host = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    host.daemon_threads = True
    threading.Thread(target=host.serve_forever, daemon=True).start()
    image_url = f"http://127.0.0.1:{host.server_address[1]}/slow.png"
    try:
        with Server(*SCRIPTED_CHAT, "--allowed-media-domain", "127.0.0.1",
                    env={"TMPDIR": str(tmp_path)}) as server:
            [scratch] = tmp_path.glob("sgl-omni-reasoner-*")
            content = [{"type": "text", "text": script(final("{media}"))},
                       {"type": "image_url", "image_url": {"url": image_url}}]
            fetching = InFlight(lambda: post_chat(
                server, {"messages": [{"role": "user", "content": content}]}))
            wait_jobs(server, "reasoner", 1)
            deadline = time.monotonic() + 10
            while not list(scratch.glob("omni-media-*")):  # the fetch's folder, in its own
                assert time.monotonic() < deadline, list(tmp_path.rglob("*"))
                time.sleep(0.05)
            signal_stage(server, "reasoner", signal.SIGKILL)
            status, text = fetching.wait()
            assert status == 500 and "reasoner stage process exited" in text, text
            wait_health(server, "ok")
            assert not scratch.exists(), list(scratch.rglob("*"))
            [fresh] = tmp_path.glob("sgl-omni-reasoner-*")
            assert fresh != scratch and list(fresh.iterdir()) == []
        assert list(tmp_path.glob("sgl-omni-*")) == []
    finally:
        release.set()
        host.shutdown()
        host.server_close()
