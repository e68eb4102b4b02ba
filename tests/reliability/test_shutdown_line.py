"""What Ctrl-C (SIGINT) prints: the grace line ("... in flight may run 1 s more") only when
requests are in flight, counting them; an idle server says it has nothing in flight."""

from __future__ import annotations

import re
import signal
import threading

import httpx

from tests.kit import wait_for
from tests.reliability.in_flight import IN_REASONER
from tests.server import SCRIPTED_CHAT, Server

GRACE = ("--server.shutdown_grace_s", "1")
MAY_RUN = "in flight may run"


def active_requests(server: Server) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("sgl_omni_active_requests "):
            return float(line.split()[1])
    return 0.0


def interrupted(server: Server) -> str:
    """The server's log once Ctrl-C (SIGINT) stopped it; it exited 0 with no traceback."""
    server.proc.send_signal(signal.SIGINT)
    code = server.proc.wait(30)
    log = server.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    return log


def test_an_idle_server_says_nothing_is_in_flight() -> None:
    server = Server(*SCRIPTED_CHAT, *GRACE)
    try:
        log = interrupted(server)
        assert "shutting down: nothing in flight; new requests get 503" in log, log[-2000:]
        assert MAY_RUN not in log
    finally:
        server.stop()


def test_a_request_in_flight_is_counted_in_the_grace_line() -> None:
    server = Server(*SCRIPTED_CHAT, *GRACE)
    body = {"messages": [{"role": "user", "content": IN_REASONER}]}
    answer: dict[str, int] = {}

    def ask() -> None:
        answer["status"] = httpx.post(f"{server.url}/v1/chat/completions", json=body,
                                      timeout=60).status_code

    thread = threading.Thread(target=ask)
    try:
        thread.start()
        wait_for(lambda: active_requests(server) >= 1, timeout=15)
        log = interrupted(server)
        thread.join(30)
        # the stage may not hold its job yet when the signal comes: the request is counted
        assert re.search(r"1 request\(s\) and [01] stage job\(s\) in flight may run 1 s more",
                         log), log[-2000:]
        assert "nothing in flight" not in log
        assert answer["status"] == 503
    finally:
        server.stop()
