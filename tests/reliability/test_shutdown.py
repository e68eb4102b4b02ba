"""SIGTERM with requests in flight (a rolling deploy draining the server): after the grace
period the server ends every request still running itself, with 503 "the server is shutting
down": a stream with its error event and ``[DONE]``, a non-streaming request with the JSON error
body and ``Retry-After``; a request whose handling starts during the drain gets the same 503.
The request log counts them as 503 (not 499), nothing is cancelled by uvicorn, the server exits
by itself with status 0 and leaves no process behind. No clock judges it: the
requests held back are released once the server's log says the drain began, and the exit is
waited for with a safety net only.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from tests.kit import metric, wait_for, wait_until
from tests.reliability.in_flight import GEN, IN_GENERATION, IN_REASONER, InFlight, interleaved
from tests.reliability.kit import TrackedServer
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM

GRACE_S = 1.0
#: A safety net for the server's exit after SIGTERM (the grace, ending the requests, stopping
#: the stages: a few seconds), not a figure.
EXIT_WITHIN_S = 60.0
DRAINING = "shutting down: new requests get 503"
SHUTTING_DOWN = "the server is shutting down"
ACTIVE_RE = re.compile(r"^sgl_omni_active_requests (\S+)$", re.M)


def problem(request: InFlight) -> str | None:
    """None if ``request`` ended with the shutdown's 503 in its route's error form (a JSON
    answer with ``Retry-After``)."""
    if request.status == 503:
        assert request.headers is not None
        if not request.headers.get("content-type", "").startswith("application/json") \
                or "retry-after" not in request.headers:
            return f"{request.label}: 503 without JSON or Retry-After: {dict(request.headers)}"
    error, wrong = request.error((503,))
    if error is None:
        return wrong
    if error.get("code") != 503 or SHUTTING_DOWN not in str(error.get("message")):
        return f"{request.label}: not the shutdown's 503: {error!r}"
    return None


def in_flight(kind: str) -> list[InFlight]:
    """Long requests of a ``kind`` server, one of them sent during the drain."""
    if kind == "direct":
        image = {"prompt": "!sleep=60 held", "size": "32x32"}
        return [InFlight("image", "/v1/images/generations", image),
                InFlight("image queued behind it", "/v1/images/generations", image),
                InFlight("image sent during the drain", "/v1/images/generations", image,
                         slow_body=True)]
    if kind == "chat":
        messages = [{"role": "user", "content": IN_REASONER}]
        return [InFlight("chat", "/v1/chat/completions", {"messages": messages}),
                InFlight("chat stream", "/v1/chat/completions",
                         {"messages": messages, "stream": True}),
                InFlight("chat sent during the drain", "/v1/chat/completions",
                         {"messages": messages}, slow_body=True)]
    out = [r for prompt, where in ((IN_GENERATION, "in generation"), (IN_REASONER, "in a turn"),
                                   (IN_GENERATION, "queued for generation"))
           for r in interleaved(prompt, where)]
    return [*out, InFlight("/generate sent during the drain", "/generate",
                           {"prompt": IN_REASONER, "stage_params": GEN}, slow_body=True)]


def active_requests(server: TrackedServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    match = ACTIVE_RE.search(text)
    return float(match[1]) if match else 0.0


#: The stage jobs that say every request of a kind reached its stage or its queue: umm, six
#: first turns ended (the requests waiting for a generation), nine turns taken and a generation
#: running; chat, both requests' turns taken; direct, one image running (the other queued).
PLACED = {"umm": {("reasoner", "completed"): 6, ("reasoner", "started"): 9,
                  ("generation", "started"): 1},
          "chat": {("reasoner", "started"): 2},
          "direct": {("generation", "started"): 1}}
SERVERS = {"umm": (*SCRIPTED_UMM, "--orchestrator.factory.max_active", "64"),
           "chat": SCRIPTED_CHAT, "direct": SCRIPTED_GENERATION}


@pytest.mark.parametrize("kind", ["umm", "chat", "direct"])
def test_sigterm_ends_in_flight_requests_with_503(kind: str) -> None:
    srv = TrackedServer(*SERVERS[kind], "--server.shutdown_grace_s", str(GRACE_S))
    try:
        requests = in_flight(kind)
        release = threading.Event()
        threads = [r.start(srv.url, release) for r in requests]
        wait_for(lambda: active_requests(srv) >= len(requests)
                 and all(metric(srv.server, stage, outcome, default=0) >= n
                         for (stage, outcome), n in PLACED[kind].items()), timeout=15)
        log_from = len(srv.server.log())

        def release_once_draining() -> None:
            wait_until(lambda: DRAINING in srv.server.log()[log_from:], timeout=EXIT_WITHIN_S)
            release.set()

        releaser = threading.Thread(target=release_once_draining, daemon=True)
        releaser.start()
        orphans = srv.graceful_stop(timeout=EXIT_WITHIN_S)
        for thread in threads:
            thread.join(10)
        log = srv.server.log()
        problems = [p for p in (problem(r) for r in requests) if p is not None]
        assert not problems, "\n".join(problems) + "\n" + log[-3000:]
        # a stop asked for and done: 0 (uvicorn alone raises the signal again as it ends)
        assert srv.server.proc.returncode == 0, log[-3000:]
        assert orphans == [], f"processes left: {orphans}"
        for bad in ("Exception in ASGI application", "CancelledError", "status=499",
                    "timeout graceful shutdown exceeded"):
            assert bad not in log, f"{bad!r} in the server log:\n{log[-3000:]}"
        assert log.count("status=503") >= len(requests), log[-3000:]
    finally:
        srv.close()
