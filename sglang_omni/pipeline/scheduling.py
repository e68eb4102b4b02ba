"""The generation stage's queue, run by the deadline planner against the event loop's clock.

``PlannedGenerations`` feeds the orchestrator's events to the pure ``GenerationPlanner`` and acts
on its answers: it admits or refuses requests (503), tells the controller each request's
allowance, starts one generation at a time in the planner's order (oldest request first), and
fails a request fast (503, its generation cancelled) when the plan says it cannot finish.

The stage is handed out by the scheduler alone: after every planner event it asks the planner
for the next generation and marks it started in the same step (no await between the choice and
``GenerationStarted``), then wakes that request. So a generation is started only when the
planner chose it, whatever order the requests' tasks wake in: while the stage is free, or, when
``preempt``, for a request older than the one whose generation runs (the stage pauses that one at
its next denoising step boundary and runs the oldest request's job first: each call carries the
request's admission time, :meth:`PlannedGenerations.admitted_at`). A generation that the plan
no longer allows is answered with a receipt (:class:`~sglang_omni.pipeline.umm.DispatchReceipt`)
instead of waiting for the stage, and a generation that does not finish (cancelled, failed fast,
failed on its stage) releases its request's plan at once, since the request ends with it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sglang_omni.aio.race import race
from sglang_omni.errors import ServiceUnavailable
from sglang_omni.pipeline.planner import (
    Admit,
    Event,
    GenerationFinished,
    GenerationPlanner,
    GenerationQueued,
    GenerationStarted,
    PlannerConfig,
    PlanUpdate,
    Released,
    Tick,
    TurnEnded,
    TurnStarted,
)
from sglang_omni.pipeline.umm import DispatchReceipt
from sglang_omni.runtime.task_errors import log_failure

log = logging.getLogger("sglang_omni.scheduling")
T = TypeVar("T")
TICK_S = 0.25


class PlanEntry:
    """A request's place in the generation queue (its ``RequestState.plan``); the scheduler
    finds it by request id, since the planner names requests by id."""

    def __init__(self, admitted_at: float) -> None:
        self.admitted_at = admitted_at  # on the scheduler's clock: the request's age
        self.after_turn = False  # the last dispatch was a Reasoner turn
        self.failure: ServiceUnavailable | None = None
        self.failed = asyncio.Event()
        self.go = asyncio.Event()  # its queued generation was started for it: run it
        self.on_stage = False  # its generation runs on the stage (until the stage ended it)
        self.released = False  # released while on the stage: let go once the stage ended it


class PlannedGenerations:
    """One per orchestrator; use from its event loop."""

    def __init__(self, timeout_s: float, max_generations: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_fail_fast: Callable[[], None] | None = None, preempt: bool = True) -> None:
        """``on_fail_fast()`` is called for each request the plan fails fast (metrics);
        ``preempt``: the generation stage pauses a younger request's job for an older one's
        (``PlannerConfig.preempt``)."""
        self.on_fail_fast = on_fail_fast or (lambda: None)
        self.clock = clock
        self.planner = GenerationPlanner(
            PlannerConfig(timeout_s=timeout_s, max_generations=max_generations,
                          preempt=preempt), clock)
        self.requests: dict[str, PlanEntry] = {}
        self._ticker: asyncio.Task | None = None
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------
    def admit(self, rid: str, waited_s: float = 0.0, steps: int | None = None) -> PlanEntry:
        """Plan a new request, of ``steps`` denoising steps a generation (None: the engine's
        default), that already waited ``waited_s`` before it reached this server (see
        :class:`Admit`); its entry, until :meth:`release`. ServiceUnavailable when the planner
        refuses it."""
        update = self.planner.handle(Admit(rid, waited_s, steps))
        entry = PlanEntry(self.clock())
        if update.refused is None:
            self.requests[rid] = entry
        self._act(update)
        if update.refused is not None:
            raise ServiceUnavailable(update.refused)
        return entry

    def release(self, rid: str) -> None:
        """Drop the request from the plan. While its generation is still on the stage (an
        aborted one ends after the stage says so) the stage stays its until then."""
        state = self.requests.get(rid)
        if state is None:
            return
        if state.on_stage:
            state.released = True
            return
        del self.requests[rid]
        self._apply(Released(rid))

    def admitted_at(self, rid: str) -> float | None:
        """When the request was admitted (the scheduler's clock), None when it is not planned:
        its generations' ``order`` on the stage (older requests' jobs go first)."""
        state = self.requests.get(rid)
        return None if state is None else state.admitted_at

    def allowance(self, rid: str) -> int | None:
        """Generations the plan still allows the request (None when it is not planned)."""
        if rid not in self.requests:
            return None
        try:
            return self.planner.allowance(rid)
        except KeyError:
            return 0

    def report(self) -> dict[str, Any]:
        """The plan as clients read it (``GET /v1/queue``): every active request's phase,
        allowance and generations used, its deadline and planned finish in seconds from now
        (in generation-stage order), and the measured times."""
        now = self.clock()
        plan = [{"rid": p.request_id, "phase": p.phase, "allowance": p.allowance,
                 "used": p.used, "deadline_in_s": round(p.deadline - now, 3),
                 "finish_in_s": None if p.finish is None else round(p.finish - now, 3)}
                for p in self.planner.plan()]
        times = self.planner.times
        return {"queued_generations": sum(1 for p in plan if p["phase"] == "queued"),
                "plan": plan,
                "measured": {"reasoner_s": times.reasoner_s, "longest_s": dict(times.longest_s),
                             "shortest_s": dict(times.shortest_s),
                             "step_s": dict(times.step_s)}}

    # --- dispatches --------------------------------------------------------------------------
    async def reasoner_turn(self, rid: str, run: Callable[[], Awaitable[T]]) -> T:
        """Run a Reasoner turn, measuring it for the plan."""
        state = self.requests.get(rid)
        if state is None:
            return await run()
        self._raise_if_failed(state)
        if state.after_turn:
            self._apply(TurnStarted(rid))
        start = time.monotonic()
        result = await self._unless_failed(state, run)
        if rid in self.requests:
            self._apply(TurnEnded(rid, time.monotonic() - start))
            state.after_turn = True
        return result

    async def generation(self, rid: str, modality: str, run: Callable[[], Awaitable[T]],
                         ran_steps: Callable[[], int | None] = lambda: None,
                         paused_s: Callable[[], float] = lambda: 0.0
                         ) -> T | DispatchReceipt:
        """Queue a generation, run it once the scheduler started it for this request, measure it
        (``ran_steps()``, read once it finished: the denoising steps it ran, if known; its time
        less ``paused_s()``, the seconds the stage kept it waiting for older requests' jobs).

        Returns a DispatchReceipt when the plan no longer allows the generation (it is not run;
        the request's next Reasoner turn is offered only a final answer); raises
        ServiceUnavailable when the plan fails the request. However else it ends without a
        result, the request's plan is released at once: the request ends with its generation.
        """
        state = self.requests.get(rid)
        if state is None:
            return await run()
        self._raise_if_failed(state)
        state.after_turn = False
        state.go.clear()
        update = self.planner.handle(GenerationQueued(rid, modality))
        self._act(update)
        if update.receipt is not None:
            log.info("request %s: the plan no longer allows its %s generation; answered with "
                     "a receipt", rid, modality)
            return DispatchReceipt(update.receipt)
        try:
            await self._unless_failed(state, state.go.wait)
            state.go.clear()
            self._raise_if_failed(state)
            start = time.monotonic()
            state.on_stage = True
            try:
                result = await self._unless_failed(state, run)
            finally:
                state.on_stage = False
        except BaseException:
            self.release(rid)
            raise
        if state.released:
            self.release(rid)
            return result
        if rid in self.requests:
            took = max(0.0, time.monotonic() - start - paused_s())
            self._apply(GenerationFinished(rid, modality, took, ran_steps()))
        return result

    @staticmethod
    def _raise_if_failed(state: PlanEntry) -> None:
        if state.failure is not None:
            raise state.failure

    async def _unless_failed(self, state: PlanEntry, work: Callable[[], Awaitable[T]]) -> T:
        """Await ``work()`` unless the plan fails the request first (then cancel it, raise 503).

        A result that arrived is returned even if the request failed meanwhile; its next dispatch
        raises the failure.
        """
        try:
            finish = await race(work(), state.failed.wait())
        except BaseException:
            task = asyncio.current_task()
            if task is None or not task.cancelling():  # the work failed, not the caller
                self._raise_if_failed(state)
            raise
        if finish.index == 1:
            self._raise_if_failed(state)
        return finish.value

    # --- planner events ----------------------------------------------------------------------
    def _apply(self, event: Event) -> None:
        self._act(self.planner.handle(event))

    def _act(self, update: PlanUpdate) -> None:
        """Act on ``update``, then hand a free stage to the planner's next generation.

        Choosing the next generation and marking it started happen together, with no await in
        between, so no other event can see a free stage that has in fact been handed out.
        """
        updates = [update]
        while updates:
            self._report(updates.pop())
            nxt = self.planner.next_generation()
            if nxt is None:
                continue
            state = self.requests.get(nxt)
            if state is None:  # not the scheduler's (cannot happen): drop it from the plan
                log.error("request %s: queued in the plan but not scheduled; dropped", nxt)
                updates.append(self.planner.handle(Released(nxt)))
                continue
            updates.append(self.planner.handle(GenerationStarted(nxt)))
            state.go.set()
        self._ensure_ticker()

    def _report(self, update: PlanUpdate) -> None:
        if update.measured_longer:
            times = self.planner.times
            log.info("a longer time was measured (Reasoner turn %.1f s, generations %s; per "
                     "denoising step %s); plans computed again", times.reasoner,
                     ", ".join(f"{m} {s:.1f} s" for m, s in sorted(times.longest_s.items()))
                     or "none yet",
                     ", ".join(f"{m} {s:.3f} s" for m, s in sorted(times.step_s.items()))
                     or "not measured")
        for change in update.lowered:
            log.info("request %s: plan lowered from %d to %d generation(s)",
                     change.request_id, change.before, change.after)
        for fail in update.failed:
            state = self.requests.get(fail.request_id)
            if state is None:
                continue
            log.warning("request %s fails fast: %s", fail.request_id, fail.message)
            self.on_fail_fast()
            state.failure = ServiceUnavailable(fail.message)
            state.failed.set()

    def _ensure_ticker(self) -> None:
        """While requests are planned, tick so overruns and expiries are noticed in time."""
        if self._closed:
            return
        if self._ticker is None or self._ticker.done():
            try:
                # a context of its own: the request that starts it is not the ticker's owner
                self._ticker = asyncio.get_running_loop().create_task(
                    self._tick(), context=contextvars.Context())
            except RuntimeError:
                self._ticker = None
            else:
                self._ticker.add_done_callback(log_failure(log, "the deadline planner's ticker"))

    async def close(self) -> None:
        """Shutdown: stop the ticker (for good: requests released afterwards start none)."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None

    async def _tick(self) -> None:
        while self.requests:
            await asyncio.sleep(TICK_S)
            if self.requests:
                self._act(self.planner.handle(Tick()))
