"""SIGTERM with requests in flight (a rolling deploy draining the server): after the grace
period the server ends every request still running itself, with 503 "the server is shutting
down": a stream with its error event and ``[DONE]``, a non-streaming request with the JSON error
body and ``Retry-After``; a request whose handling starts during the drain gets the same 503.
The request log counts them as 503 (not 499), nothing is cancelled by uvicorn, the server exits
(by the signal, as uvicorn ends) within its bound and leaves no process behind.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.kit import wait_for
from tests.reliability.kit import SMALL, TrackedServer, error_shape_problem, parse_sse, script
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM

GRACE_S = 1.0
#: From SIGTERM to the server's exit: the grace, ending the requests, stopping the stages.
EXIT_WITHIN_S = GRACE_S + 8.0
SHUTTING_DOWN = "the server is shutting down"
IN_REASONER = script({"action": "final", "text": "never", "delay_s": 60})
IN_GENERATION = script({"action": "image", "prompt": "!sleep=60 held"},
                       {"action": "final", "text": "never"})
GEN = {"generation": SMALL}
ACTIVE_RE = re.compile(r"^sgl_omni_active_requests (\S+)$", re.M)


@dataclass
class InFlight:
    """One request running in a thread; ``slow_body`` holds its body back until ``release``
    is set (so its handling starts during the drain)."""

    label: str
    route: str
    body: dict[str, Any]
    slow_body: bool = False
    status: int | None = None
    headers: httpx.Headers | None = None
    text: str = ""

    def start(self, url: str, release: threading.Event) -> threading.Thread:
        def content() -> Iterator[bytes]:
            raw = httpx.Request("POST", "/", json=self.body).content
            yield raw[:10]
            release.wait(30)
            yield raw[10:]

        def run() -> None:
            try:
                with httpx.Client(timeout=60) as http:
                    if self.slow_body:
                        resp = http.post(url + self.route, content=content(),
                                         headers={"Content-Type": "application/json"})
                    else:
                        resp = http.post(url + self.route, json=self.body)
                self.status, self.headers, self.text = resp.status_code, resp.headers, resp.text
            except httpx.HTTPError as exc:
                self.text = f"transport error {exc!r}"

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def problem(self) -> str | None:
        """None if the request ended with the shutdown's 503 in its route's error form."""
        if self.status == 200 and self.body.get("stream"):
            events = parse_sse(self.text)
            if not events or events[-1][1] != "[DONE]":
                return f"{self.label}: stream not ended by [DONE]: {self.text[-300:]!r}"
            event, data = events[-2] if len(events) > 1 else ("", {})
            error = data if event == "error" else data.get("error") \
                if isinstance(data, dict) else None
            if not isinstance(error, dict):
                return f"{self.label}: no error before [DONE]: {self.text[-300:]!r}"
        elif self.status == 503:
            assert self.headers is not None
            if not self.headers.get("content-type", "").startswith("application/json") \
                    or "retry-after" not in self.headers:
                return f"{self.label}: 503 without JSON or Retry-After: {dict(self.headers)}"
            body = httpx.Response(503, content=self.text.encode()).json()
            if error_shape_problem(body) is not None:
                return f"{self.label}: {error_shape_problem(body)}"
            error = body["error"]
        else:
            return f"{self.label}: status {self.status}: {self.text[:300]}"
        if error.get("code") != 503 or SHUTTING_DOWN not in str(error.get("message")):
            return f"{self.label}: not the shutdown's 503: {error!r}"
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
    out = []
    for prompt, where in ((IN_GENERATION, "in generation"), (IN_REASONER, "in a turn"),
                          (IN_GENERATION, "queued for generation")):
        out += [InFlight(f"/generate {where}", "/generate",
                         {"prompt": prompt, "stage_params": GEN}),
                InFlight(f"/generate stream {where}", "/generate",
                         {"prompt": prompt, "stage_params": GEN, "stream": True}),
                InFlight(f"chat stream {where}", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": prompt}],
                          "stage_params": GEN, "stream": True})]
    return [*out, InFlight("/generate sent during the drain", "/generate",
                           {"prompt": IN_REASONER, "stage_params": GEN}, slow_body=True)]


def active_requests(server: TrackedServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    match = ACTIVE_RE.search(text)
    return float(match[1]) if match else 0.0


SERVERS = {"umm": (*SCRIPTED_UMM, "--orchestrator.factory.max_active", "64"),
           "chat": SCRIPTED_CHAT, "direct": SCRIPTED_GENERATION}


@pytest.mark.parametrize("kind", ["umm", "chat", "direct"])
def test_sigterm_ends_in_flight_requests_with_503(kind: str) -> None:
    srv = TrackedServer(*SERVERS[kind], "--server.shutdown_grace_s", str(GRACE_S))
    try:
        requests = in_flight(kind)
        release = threading.Event()
        threads = [r.start(srv.url, release) for r in requests]
        wait_for(lambda: active_requests(srv) >= len(requests), timeout=15)
        time.sleep(0.5)  # every request reached its stage (or its queue)
        releaser = threading.Timer(0.3, release.set)  # once the drain began
        signalled = time.monotonic()
        releaser.start()
        orphans = srv.graceful_stop(timeout=EXIT_WITHIN_S + 5)
        exited = time.monotonic() - signalled
        for thread in threads:
            thread.join(10)
        log = srv.server.log()
        problems = [p for p in (r.problem() for r in requests) if p is not None]
        assert not problems, "\n".join(problems) + "\n" + log[-3000:]
        # uvicorn raises the signal again once it stopped, as before the drain existed
        assert srv.server.proc.returncode == -signal.SIGTERM, log[-3000:]
        assert exited < EXIT_WITHIN_S, f"exited {exited:.1f} s after SIGTERM"
        assert orphans == [], f"processes left: {orphans}"
        for bad in ("Exception in ASGI application", "CancelledError", "status=499",
                    "timeout graceful shutdown exceeded"):
            assert bad not in log, f"{bad!r} in the server log:\n{log[-3000:]}"
        assert log.count("status=503") >= len(requests), log[-3000:]
    finally:
        srv.close()
