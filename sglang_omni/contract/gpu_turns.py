"""The generation stage's GPU turns: one job computes at a time, the oldest request's first.

A stage that serves generations holds one :class:`GpuTurns`; each of its jobs gets a
:class:`Turn`. The stage takes the turn before the engine runs the job (:meth:`Turn.begin`) and
gives it back when the job ends (:meth:`Turn.end`). Between two denoising steps an engine calls
:meth:`Turn.boundary` (``Job.step_boundary``) with the device bytes the job would keep while
paused (its latents, scheduler state and captured step); when a job of an *older* request waits
for the GPU, the job pauses there, the older one runs, and the job resumes where it stopped once
it is the oldest waiting again. It is not paused (the older job waits for its end, as before)
when keeping its bytes would take the paused jobs past ``budget_bytes``, or when
:data:`MAX_PAUSED` jobs are paused already (the nesting bound). An engine that never calls
``boundary`` (native generation, the hf stock ``__call__``) runs its jobs one at a time whole.

*Older* is the smaller ``order``: the request's admission time on the server's monotonic clock
(an interleaved request's admission by the deadline planner; a direct image, video or action
request's when its route called the stage), ties broken by arrival at the stage.

A waiting job (to begin, or paused) reports no progress of its own: the stage is judged by the
job holding the GPU, so a hung holder is found however many jobs wait behind it (a waiting job
that reported progress would hide it). It checks every :data:`WAIT_POLL_S` whether its
``cancelled`` event is set, and stops waiting then or when its task is cancelled; its kept bytes
are then no longer counted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable

from sglang_omni.aio.wait import wait_set

log = logging.getLogger("sglang_omni.stage")

#: How often a waiting job checks whether it was cancelled.
WAIT_POLL_S = 0.25
#: The most jobs paused at once (a third, even older request pauses the second, and so on).
MAX_PAUSED = 3

Key = tuple[float, int]


class Turn:
    """One job's place in the stage's turns; its methods are the job's (see the module)."""

    def __init__(self, turns: GpuTurns, rid: str, key: Key, cancelled: threading.Event,
                 progress: Callable[[], None]) -> None:
        self._turns, self.rid, self.key = turns, rid, key
        self.cancelled, self.progress = cancelled, progress
        #: Seconds spent waiting to begin, and paused at step boundaries.
        self.waited_s = 0.0
        self.paused_s = 0.0
        self.pauses = 0
        self.wake: Callable[[], None] | None = None  # set while it waits on an event loop

    async def begin(self) -> None:
        """Wait (on the event loop) until this job holds the GPU."""
        started = time.monotonic()
        waited = True
        try:
            waited = await self._turns.wait_async(self, 0)
        finally:
            if waited:  # a job that found the GPU free waited for nothing (no paused span)
                self.waited_s += time.monotonic() - started

    def boundary(self, kept_bytes: int | None, step: int = 0, steps: int = 0) -> None:
        """A step boundary, from the engine's thread: pause here while an older job runs (see
        the module); ``kept_bytes`` None: this job cannot pause here."""
        if kept_bytes is None or not self._turns.yields(self, kept_bytes, step, steps):
            return
        started = time.monotonic()
        try:
            self._turns.wait_blocking(self, kept_bytes)
        finally:
            self._resumed(started, step, steps)

    async def boundary_async(self, kept_bytes: int, step: int = 0, steps: int = 0) -> None:
        """:meth:`boundary` for an engine running on the event loop."""
        if not self._turns.yields(self, kept_bytes, step, steps):
            return
        started = time.monotonic()
        try:
            await self._turns.wait_async(self, kept_bytes)
        finally:
            self._resumed(started, step, steps)

    def _resumed(self, started: float, step: int, steps: int) -> None:
        paused = time.monotonic() - started
        self.paused_s += paused
        if not self.cancelled.is_set():
            log.info("request %s: resumed at step %d of %d after %.2f s paused", self.rid,
                     step, steps, paused)

    def end(self) -> None:
        """The job ended (however): give the GPU to the oldest waiting job."""
        self._turns.leave(self)


class GpuTurns:
    """The turns of one stage's jobs; thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._holder: Turn | None = None
        self._waiting: dict[Key, tuple[Turn, int]] = {}  # key -> (turn, its kept bytes)
        self._refused: set[tuple[Key, Key]] = set()  # (runner, older) pairs logged once
        self.preemptions = 0

    def turn(self, rid: str, order: float, cancelled: threading.Event,
             progress: Callable[[], None]) -> Turn:
        """A new job's turn; ``order``: its request's admission time (see the module)."""
        return Turn(self, rid, (order, next(self._seq)), cancelled, progress)

    def stats(self) -> dict[str, int]:
        """``preemptions`` (jobs paused so far), ``paused`` and ``paused_bytes`` (now)."""
        with self._cond:
            paused = [kept for turn, kept in self._waiting.values() if kept > 0]
            return {"preemptions": self.preemptions, "paused": len(paused),
                    "paused_bytes": sum(paused)}

    # --- under the lock ------------------------------------------------------------------------
    def _paused_bytes(self) -> int:
        return sum(kept for _, kept in self._waiting.values())

    def _hand_over(self) -> None:
        """Give a free GPU to the oldest waiting job."""
        if self._holder is None and self._waiting:
            turn, _ = self._waiting.pop(min(self._waiting))
            self._holder = turn
            self._cond.notify_all()
            if turn.wake is not None:
                turn.wake()

    def yields(self, turn: Turn, kept: int, step: int, steps: int) -> bool:
        """Whether ``turn``, holding the GPU at a step boundary, pauses now (and if so, hands
        the GPU over and starts waiting)."""
        with self._cond:
            if self._holder is not turn or not self._waiting:
                return False
            older = min(self._waiting)
            if older > turn.key:
                return False
            paused = sum(1 for _, k in self._waiting.values() if k > 0)
            if paused >= MAX_PAUSED or self._paused_bytes() + kept > self.budget_bytes:
                if (turn.key, older) not in self._refused:
                    self._refused.add((turn.key, older))
                    log.info("request %s: not paused for the older request %s: %s", turn.rid,
                             self._waiting[older][0].rid,
                             f"{paused} jobs are paused already (the most at once)"
                             if paused >= MAX_PAUSED else
                             f"keeping its {kept} bytes would exceed the pause budget "
                             f"({self.budget_bytes} bytes, {self._paused_bytes()} kept)")
                return False
            self.preemptions += 1
            turn.pauses += 1
            log.info("request %s: paused at step %d of %d for the older request %s (keeps %d "
                     "bytes on the device)", turn.rid, step, steps, self._waiting[older][0].rid,
                     kept)
            self._holder = None
            self._waiting[turn.key] = (turn, max(1, kept))
            self._hand_over()
            return True

    def _leave_locked(self, turn: Turn) -> None:
        _, kept = self._waiting.pop(turn.key, (turn, 0))
        if kept > 0:
            log.info("request %s: its paused generation ended (cancelled); the %d bytes it kept "
                     "are freed", turn.rid, kept)
        self._refused = {pair for pair in self._refused if turn.key not in pair}
        if self._holder is turn:
            self._holder = None
        self._hand_over()

    def leave(self, turn: Turn) -> None:
        with self._cond:
            self._leave_locked(turn)

    # --- waiting -------------------------------------------------------------------------------
    def wait_blocking(self, turn: Turn, kept: int) -> None:
        """Wait on this thread until ``turn`` holds the GPU, or until it is cancelled (then it
        leaves the turns: the engine sees ``cancelled`` and stops)."""
        with self._cond:
            while self._holder is not turn:
                if turn.cancelled.is_set():
                    self._leave_locked(turn)
                    return
                self._cond.wait(WAIT_POLL_S)

    async def wait_async(self, turn: Turn, kept: int) -> bool:
        """Wait on the event loop until ``turn`` holds the GPU; a job not begun yet (``kept``
        0) joins the waiting here. False when it held it at once. Cancellation leaves the
        turns."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        with self._cond:

            def wake() -> None:
                loop.call_soon_threadsafe(woken.set)

            turn.wake = wake
            if kept == 0 and self._holder is not turn:
                self._waiting[turn.key] = (turn, 0)
                self._hand_over()
        waited = False
        try:
            while True:
                with self._cond:
                    if self._holder is turn:
                        return waited
                waited = True
                if turn.cancelled.is_set():
                    raise asyncio.CancelledError()
                await wait_set(woken, WAIT_POLL_S)  # a cancellation here always propagates
                woken.clear()
        except BaseException:
            self.leave(turn)
            raise
        finally:
            with self._cond:
                turn.wake = None
