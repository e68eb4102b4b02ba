"""The server's heartbeat goes out while its event loop runs late.

A heartbeat check that comes late (the loop was held up: a loaded machine) judges nothing,
since the stage's answers may not be read yet. It used to send nothing either: on a loop late
at every check (load average 20 on two cores, a large body being read), the stages heard no
heartbeat for 10 s, took the server for frozen and exited. Here the supervisor runs on an
injected clock whose every check comes late, with a stand-in stage handle.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sglang_omni.runtime.supervisor import LATE_TICK_S, RestartPolicy, StageSupervisor

CHECKS = 200


class _Done(Exception):
    """The test's number of checks ran."""


class Clock:
    """Each sleep lasts ``late_s`` longer than asked; the run ends after :data:`CHECKS`."""

    def __init__(self, late_s: float) -> None:
        self.now = 1000.0
        self.late_s = late_s
        self.checks = 0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if self.checks == CHECKS:
            raise _Done()
        self.checks += 1
        self.now += seconds + self.late_s
        await asyncio.sleep(0)


class Handle:
    """A stage handle: healthy, no jobs; answers each ping at once when ``answers``."""

    def __init__(self, clock: Clock, answers: bool) -> None:
        self.clock, self.answers = clock, answers
        self.healthy = True
        self.last_seen = clock.now
        self.pings = 0
        self.faults: list[str] = []
        self.restart_decision: Any = None

    def silent_with_jobs_s(self) -> float:
        return 0.0

    def ping(self) -> None:
        self.pings += 1
        if self.answers:
            self.last_seen = self.clock.now

    def stall(self, silent: float) -> None:
        self.faults.append(f"stall {silent:.1f}")
        self.healthy = False

    def hang(self, quiet: float) -> None:
        self.faults.append(f"hang {quiet:.1f}")
        self.healthy = False


def run(late_s: float, answers: bool) -> Handle:
    clock = Clock(late_s)
    handle = Handle(clock, answers)
    policy = RestartPolicy(heartbeat_interval_s=1.0, stall_timeout_s=3.0)
    supervisor = StageSupervisor(handle, policy,  # type: ignore[arg-type]
                                 clock=clock.monotonic, sleep=clock.sleep)
    with pytest.raises(_Done):
        asyncio.run(supervisor._heartbeat())
    return handle


def test_a_late_loop_still_sends_heartbeats() -> None:
    handle = run(late_s=LATE_TICK_S + 1.0, answers=True)  # every check comes late
    assert handle.pings == CHECKS  # one per check: each is at least the interval after the last
    assert handle.faults == []


def test_a_late_check_judges_nothing() -> None:
    """A stage whose answers the late loop did not read is not judged stalled (the server
    cannot tell its own delay from the stage's), although the pings go on."""
    handle = run(late_s=LATE_TICK_S + 1.0, answers=False)
    assert handle.faults == [] and handle.pings == CHECKS


def test_an_on_time_loop_judges_a_silent_stage_stalled() -> None:
    handle = run(late_s=0.0, answers=False)
    assert handle.faults and handle.faults[0].startswith("stall ")
