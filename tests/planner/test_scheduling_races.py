"""``PlannedGenerations`` under many concurrent requests: one generation at a time, the oldest
queued first, and no orchestration race ever raises into a request. With ``preempt`` a
generation may also start while a younger request's runs (the stage would pause that one), never
while an older one's does.

Fake dispatches (no stages): Reasoner turns and generations sleep 0 or a few milliseconds, so the
requests' tasks wake in every order; some requests are cancelled at random moments. Each request
may only end with its result, a 503 from the plan, a receipt, or its cancellation.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from sglang_omni.errors import ServiceUnavailable
from sglang_omni.pipeline.planner import Event, GenerationStarted
from sglang_omni.pipeline.scheduling import PlannedGenerations
from sglang_omni.pipeline.umm import DispatchReceipt


class Watch:
    """Checks the stage's invariants as the scheduler drives the planner."""

    def __init__(self, sched: PlannedGenerations, preempt: bool = False) -> None:
        self.sched = sched
        self.preempt = preempt
        self.running: set[str] = set()
        self.generations = 0
        self.started: list[str] = []
        self.unrun: set[str] = set()  # started, not run yet
        handle = sched.planner.handle

        def checked(event: Event):
            if isinstance(event, GenerationStarted):
                plans = sched.planner.plan()
                queued = [p.request_id for p in plans if p.phase == "queued"]
                assert queued and queued[0] == event.request_id, (event, plans)  # oldest first
                running = [p.request_id for p in plans if p.phase == "generating"]
                if preempt:  # only a younger request's generation may be running (and pause)
                    assert all(_age(r) > _age(event.request_id) for r in running), plans
                else:
                    assert not running, plans
                self.started.append(event.request_id)
                self.unrun.add(event.request_id)
            return handle(event)

        sched.planner.handle = checked  # type: ignore[method-assign]

    async def generate(self, rid: str, sleep: float) -> str:
        # A generation whose request ended (cancelled, failed fast) may still be unwinding.
        live = {r for r in self.running
                if r in self.sched.requests and self.sched.requests[r].failure is None
                and not (self.preempt and _age(r) > _age(rid))}  # paused by this one
        assert not live, f"{rid} runs while {live} run"
        if self.preempt:  # older requests' starts may follow at once, before this one runs
            assert rid in self.unrun, "a generation the scheduler did not start"
            self.unrun.discard(rid)
        else:
            assert self.started and self.started[-1] == rid, \
                "a generation the scheduler did not start"
        self.running.add(rid)
        try:
            await asyncio.sleep(sleep)
        finally:
            self.running.discard(rid)
        self.generations += 1
        return f"media of {rid}"


def _age(rid: str) -> int:
    """The admission rank of request ``r<i>`` (they are admitted in the order of ``i``)."""
    return int(rid[1:])


async def one_request(sched: PlannedGenerations, watch: Watch, rid: str, rng: random.Random,
                      sleeps: tuple[float, ...]) -> str:
    sched.admit(rid)
    try:
        for _ in range(rng.randint(1, 4)):
            await sched.reasoner_turn(rid, lambda: asyncio.sleep(rng.choice(sleeps)))
            made = await sched.generation(rid, rng.choice(["image", "video"]),
                                          lambda: watch.generate(rid, rng.choice(sleeps)))
            if isinstance(made, DispatchReceipt):
                break
        await sched.reasoner_turn(rid, lambda: asyncio.sleep(rng.choice(sleeps)))
        return "completed"
    finally:
        sched.release(rid)


async def scenario(seed: int, clients: int, sleeps: tuple[float, ...], timeout_s: float,
                   cancel_share: float, preempt: bool = False) -> dict[str, int]:
    rng = random.Random(seed)
    sched = PlannedGenerations(timeout_s=timeout_s, max_generations=8, preempt=preempt)
    watch = Watch(sched, preempt)
    tasks = []
    for i in range(clients):
        tasks.append(asyncio.create_task(one_request(sched, watch, f"r{i}", rng, sleeps)))
        if rng.random() < 0.3:
            await asyncio.sleep(0)
    for task in tasks:
        if rng.random() < cancel_share:
            asyncio.get_running_loop().call_later(rng.choice((0, 0.001, 0.005, 0.02)),
                                                  task.cancel)
    outcomes: dict[str, int] = {}
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, asyncio.CancelledError):
            kind = "cancelled"
        elif isinstance(result, ServiceUnavailable):
            kind = "503"
        elif isinstance(result, BaseException):
            raise result  # anything else is a race raised into a request
        else:
            kind = result
        outcomes[kind] = outcomes.get(kind, 0) + 1
    assert not sched.requests and sched.planner.plan() == ()
    assert sched.planner.next_generation() is None
    assert watch.generations > 0
    return outcomes


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("preempt", [False, True])
def test_concurrent_requests_with_near_instant_dispatches_all_complete(seed: int,
                                                                       preempt: bool) -> None:
    outcomes = asyncio.run(scenario(seed, clients=48, sleeps=(0.0, 0.0, 0.0005), timeout_s=3600,
                                    cancel_share=0, preempt=preempt))
    assert outcomes == {"completed": 48}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("preempt", [False, True])
def test_mixed_sleeps_and_cancellations_never_break_the_plan(seed: int, preempt: bool) -> None:
    outcomes = asyncio.run(scenario(seed, clients=40, sleeps=(0.0, 0.0, 0.001, 0.003),
                                    timeout_s=3600, cancel_share=0.3, preempt=preempt))
    assert set(outcomes) <= {"completed", "cancelled"}
    assert outcomes.get("completed", 0) > 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("preempt", [False, True])
def test_an_overloaded_plan_fails_fast_or_refuses_but_never_races(seed: int,
                                                                   preempt: bool) -> None:
    # 0.3 s deadlines cannot hold 30 requests of up to 4 generations of up to 10 ms each.
    outcomes = asyncio.run(scenario(seed, clients=30, sleeps=(0.0, 0.002, 0.01),
                                    timeout_s=0.3, cancel_share=0.2, preempt=preempt))
    assert set(outcomes) <= {"completed", "cancelled", "503"}


def test_the_ticker_is_owned_its_failure_logged_and_close_ends_it(caplog) -> None:
    async def scenario() -> None:
        sched = PlannedGenerations(timeout_s=60, max_generations=2)
        sched.admit("a")  # a planned request: the ticker runs
        ticker = sched._ticker
        assert ticker is not None and not ticker.done()
        await sched.close()
        assert ticker.done() and sched._ticker is None

        broken = PlannedGenerations(timeout_s=60, max_generations=2)

        def fail(event: Event):
            raise RuntimeError("planner bug")

        broken.admit("b")
        broken.planner.handle = fail  # type: ignore[method-assign]
        with caplog.at_level("ERROR", logger="sglang_omni.scheduling"):
            await asyncio.sleep(0.4)  # one tick (TICK_S 0.25) raises in the ticker
        assert broken._ticker is not None and broken._ticker.done()
        assert "the deadline planner's ticker failed" in caplog.text
        assert "planner bug" in caplog.text

    asyncio.run(scenario())
