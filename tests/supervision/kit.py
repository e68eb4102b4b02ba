"""Helpers for the supervision tests: fast restart flags, fault injection, health polling."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil

from sglang_omni.engines.native.lifecycle import running
from tests.kit import metric, wait_until
from tests.server import Server

HTTP = httpx.Client(timeout=30)
#: How long a stage may take to come back: a safety net, not a figure (benchmarks/faults.py
#: measures how fast a fault is found, answered and recovered from).
BACK_WITHIN_S = 30.0


def fast(*stages: str, stall_s: float = 30.0, restarts: int = 3,
         progress_s: float = 600.0) -> list[str]:
    """Flags: a short restart backoff, a quick heartbeat, ``stall_s`` and ``progress_s`` (the
    progress timeout) for ``stages``."""
    flags: list[str] = []
    for stage in stages:
        flags += [f"--{stage}.factory.restart_backoff_s", "1",
                  f"--{stage}.factory.heartbeat_interval_s", "0.2",
                  f"--{stage}.factory.stall_timeout_s", str(stall_s),
                  f"--{stage}.factory.progress_timeout_s", str(progress_s),
                  f"--{stage}.factory.max_restarts", str(restarts)]
    return flags


class InFlight:
    """Runs ``send()`` on a thread; ``ended`` is when it returned (for messages only: the
    tests judge what ended a request by its answer and the server's log, not by a clock)."""

    def __init__(self, send: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.ended = 0.0
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True)
        self._thread.start()

    def _run(self, send: Callable[[], Any]) -> None:
        try:
            self.result = send()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        self.ended = time.monotonic()

    def wait(self, timeout: float = 60) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request did not end"
        if self.error is not None:
            raise self.error
        return self.result


def health(server: Server) -> httpx.Response:
    return HTTP.get(f"{server.url}/health", timeout=5)


def wait_health(server: Server, status: str, timeout: float = BACK_WITHIN_S) -> dict:
    """Poll /health until its status is ``status``; the body."""
    last: dict = {}

    def reached() -> bool:
        last.clear()
        last.update(health(server).json())
        return last["status"] == status

    if wait_until(reached, timeout, poll=0.02):
        return last
    raise AssertionError(f"/health never said {status!r}; last: {last}")


def wait_jobs(server: Server, stage: str, started: int, timeout: float = 10) -> None:
    """Wait until the stage's engine has taken ``started`` jobs (``/metrics``' ``started``
    outcome: the request is in flight and running on the stage)."""
    if not wait_until(lambda: metric(server, stage, "started", default=0) >= started,
                      timeout, poll=0.02):
        raise AssertionError(f"{stage} never started {started} job(s)")


def restarts(server: Server, stage: str) -> float:
    text = HTTP.get(f"{server.url}/metrics").text
    match = re.search(rf'^sgl_omni_stage_restarts_total\{{stage="{stage}"\}} (\S+)$', text, re.M)
    assert match, "no sgl_omni_stage_restarts_total in /metrics"
    return float(match[1])


def signal_stage(server: Server, stage: str, sig: int) -> tuple[int, int]:
    """Send ``sig`` to the stage process; (its pid, how long the server's log was then)."""
    pid = server.stage_pid(stage)
    log_from = len(server.log())
    os.kill(pid, sig)
    return pid, log_from


def failed_at_exit(server: Server, stage: str, log_from: int) -> list[int]:
    """How many requests in flight the server failed as the stage's process went, by each
    exit the log reports after ``log_from`` (the line ``the <stage> stage process exited with
    code N; K request(s) in flight failed with it``): the requests failed at the exit itself,
    not by a later timeout or the end of their work."""
    pattern = rf"the {stage} stage process exited with code \S+; (\d+) request\(s\) in flight " \
              r"failed with it"
    wait_until(lambda: re.search(pattern, server.log()[log_from:]) is not None, timeout=30)
    return [int(n) for n in re.findall(pattern, server.log()[log_from:])]


def process_tree(server: Server) -> set[psutil.Process]:
    return {p for p in server.descendants() if running(p)}


def assert_gone(procs: set[psutil.Process]) -> None:
    """Every process of ``procs`` has exited (none left running or stopped)."""
    def alive() -> list[int]:
        return [p.pid for p in procs if running(p)]

    if not wait_until(lambda: not alive(), timeout=10):
        raise AssertionError(f"orphan processes left: {alive()}")
