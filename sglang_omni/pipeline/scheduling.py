"""The generation stage's queue, run by the deadline planner against the event loop's clock.

``PlannedGenerations`` feeds the orchestrator's events to the pure ``GenerationPlanner`` and acts
on its answers: it admits or refuses requests (503), tells the controller each request's
allowance, starts one generation at a time in the planner's order (oldest request first), and
fails a request fast (503, its generation cancelled) when the plan says it cannot finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

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

log = logging.getLogger("sglang_omni.scheduling")
T = TypeVar("T")
TICK_S = 0.25


class _Request:
    def __init__(self) -> None:
        self.after_turn = False  # the last dispatch was a Reasoner turn
        self.failure: ServiceUnavailable | None = None
        self.failed = asyncio.Event()
        self.go = asyncio.Event()  # its queued generation may start


class PlannedGenerations:
    """One per orchestrator; use from its event loop."""

    def __init__(self, timeout_s: float, max_generations: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.planner = GenerationPlanner(
            PlannerConfig(timeout_s=timeout_s, max_generations=max_generations, max_active=None),
            clock)
        self.requests: dict[str, _Request] = {}
        self._ticker: asyncio.Task | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def admit(self, rid: str) -> None:
        """Plan a new request; ServiceUnavailable when an idle server would give it more."""
        update = self.planner.handle(Admit(rid))
        admission = update.admission
        if admission is None or not admission.admitted:
            self._act(update)
            message = admission.message if admission else "the generation plan is full"
            raise ServiceUnavailable(message or "the generation plan is full; retry later")
        self.requests[rid] = _Request()
        self._act(update)

    def release(self, rid: str) -> None:
        if self.requests.pop(rid, None) is not None:
            self._apply(Released(rid))

    def allowance(self, rid: str) -> int | None:
        """Generations the plan still allows the request (None when it is not planned)."""
        if rid not in self.requests:
            return None
        try:
            return self.planner.allowance(rid)
        except KeyError:
            return 0

    # --- dispatches --------------------------------------------------------------------------
    async def reasoner_turn(self, rid: str, run: Callable[[], Awaitable[T]]) -> T:
        """Run a Reasoner turn, measuring it for the plan."""
        state = self.requests.get(rid)
        if state is not None and state.after_turn:
            self._apply(TurnStarted(rid))
        start = time.monotonic()
        result = await self._unless_failed(rid, run())
        if state is not None and rid in self.requests:
            self._apply(TurnEnded(rid, time.monotonic() - start))
            state.after_turn = True
        return result

    async def generation(self, rid: str, modality: str, run: Callable[[], Awaitable[T]]) -> T:
        """Queue a generation, start it when the plan says so, measure it."""
        state = self.requests.get(rid)
        if state is None:
            return await run()
        state.after_turn = False
        self._apply(GenerationQueued(rid, modality))
        await self._unless_failed(rid, state.go.wait())
        state.go.clear()
        self._apply(GenerationStarted(rid))
        start = time.monotonic()
        result = await self._unless_failed(rid, run())
        if rid in self.requests:
            self._apply(GenerationFinished(rid, modality, time.monotonic() - start))
        return result

    async def _unless_failed(self, rid: str, work: Awaitable[T]) -> T:
        """Await ``work`` unless the plan fails the request first (then cancel it, raise 503)."""
        state = self.requests.get(rid)
        task = asyncio.ensure_future(work)
        if state is None:
            return await task
        failed = asyncio.ensure_future(state.failed.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if state.failure is not None and not (task.done() and not task.cancelled()
                                              and task.exception() is None):
            raise state.failure
        return task.result()

    # --- planner events ----------------------------------------------------------------------
    def _apply(self, event: Event) -> None:
        self._act(self.planner.handle(event))

    def _act(self, update: PlanUpdate) -> None:
        for change in update.lowered:
            log.info("request %s: plan lowered from %d to %d generation(s)",
                     change.request_id, change.before, change.after)
        for fail in update.failed:
            state = self.requests.get(fail.request_id)
            if state is None:
                continue
            log.warning("request %s fails fast: %s", fail.request_id, fail.message)
            state.failure = ServiceUnavailable(fail.message)
            state.failed.set()
        nxt = self.planner.next_generation()
        if nxt is not None and nxt in self.requests:
            self.requests[nxt].go.set()
        self._ensure_ticker()

    def _ensure_ticker(self) -> None:
        """While requests are planned, tick so overruns and expiries are noticed in time."""
        if self._ticker is None or self._ticker.done():
            try:
                self._ticker = asyncio.get_running_loop().create_task(self._tick())
            except RuntimeError:
                self._ticker = None

    async def _tick(self) -> None:
        while self.requests:
            await asyncio.sleep(TICK_S)
            if self.requests:
                self._act(self.planner.handle(Tick()))
