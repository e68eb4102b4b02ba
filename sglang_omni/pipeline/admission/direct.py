"""Admission of the direct image and action requests (the routes whose client waits for the
answer), each action of a realtime action session and each chunk of a realtime video session
(:mod:`.realtime`) on the generation stage, as every other route has one.

At most ``server.max_direct_queue`` of them are queued or running at once: the next is refused
with 503 (``Retry-After``) before any work. They start one at a time, in arrival order (the
engine runs one job at a time), and one waits at most ``server.direct_wait_s`` for its turn: past
that it is refused with 503. Deadline planning: a request that the requests ahead of it, at the
measured time per request, would keep waiting past ``direct_wait_s`` is refused at once instead
of after waiting. Video jobs are bounded by their own limit (:mod:`.video_jobs`). Refusals are
counted by reason (``direct_queue``, ``direct_plan``, ``direct_wait``) in the server's metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sglang_omni.errors import ServiceUnavailable

#: Weight of the newest request in the measured time per request.
_SMOOTHING = 0.3


class DirectTicket:
    """One direct request's turn on the generation stage; :meth:`release` (idempotent) ends
    it: the next request in line starts, and the time it held the stage is measured."""

    def __init__(self, admission: DirectAdmission) -> None:
        self._admission = admission
        self._started = time.monotonic()
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._admission._ended(time.monotonic() - self._started)


class DirectAdmission:
    """The queue of one server's image and action requests. One event loop; a request counts
    from its :meth:`enter` to its ticket's release."""

    def __init__(self, limit: int, wait_s: float,
                 on_refused: Callable[[str], None] = lambda _: None) -> None:
        self.limit, self.wait_s, self.on_refused = limit, wait_s, on_refused
        #: Requests queued or running.
        self.held = 0
        #: The measured seconds one request holds the stage (None before the first).
        self.job_s: float | None = None
        self._turn = asyncio.Lock()

    def _refuse(self, reason: str, message: str) -> ServiceUnavailable:
        self.on_refused(reason)
        return ServiceUnavailable(message)

    async def enter(self) -> DirectTicket:
        """Wait for the stage's turn: the ticket that holds it (503 when refused; see the
        module contract). Cancelled while waiting, the request leaves the queue."""
        if self.held >= self.limit:
            raise self._refuse("direct_queue", f"{self.held} image and action requests are "
                               f"queued or running (server.max_direct_queue {self.limit}); "
                               "retry later")
        if self.job_s is not None and self.held * self.job_s > self.wait_s:
            raise self._refuse("direct_plan", f"the {self.held} image and action requests "
                               f"ahead take about {self.held * self.job_s:.0f} s, longer "
                               f"than server.direct_wait_s ({self.wait_s:g} s); retry later")
        self.held += 1
        try:
            async with asyncio.timeout(self.wait_s):
                await self._turn.acquire()
        except TimeoutError:
            self.held -= 1
            raise self._refuse("direct_wait", f"waited {self.wait_s:g} s "
                               "(server.direct_wait_s) for the generation stage behind "
                               "other requests; retry later") from None
        except BaseException:
            self.held -= 1
            raise
        return DirectTicket(self)

    def _ended(self, took: float) -> None:
        """A ticket's release: the next request starts; ``took`` updates the measured time."""
        self._turn.release()
        self.job_s = took if self.job_s is None \
            else (1 - _SMOOTHING) * self.job_s + _SMOOTHING * took
        self.held -= 1
