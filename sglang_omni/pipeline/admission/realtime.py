"""Admission of the realtime sessions (``WS /v1/actions/realtime``,
``WS /v1/realtime_video/generate``).

* A session is admitted while the server is not shutting down (:meth:`Sessions.enter`; after
  :meth:`Sessions.close` a new one is refused with ``ShuttingDown``). :class:`Sessions` owns the
  running sessions' tasks, so server shutdown cancels them (each then aborts its generation)
  and waits for them to end.
* One realtime video session runs at a time (the generation stage serves one generation at a
  time): a new one waits at most :data:`SLOT_WAIT_S` for the slot (a session whose client left
  keeps it until the stage has ended its aborted chunk), then is refused
  (:class:`SessionSlotTaken`).
* A realtime video session runs at most ``server.max_realtime_chunks`` chunks
  (:func:`session_chunks`; 400 naming ``max_chunks`` beyond it).
* Each action of a session and each chunk takes a ticket of the direct queue
  (:mod:`.direct`) for that generation only, never for the whole connection: an idle session
  holds none, and a refused one gets the refusal an HTTP request gets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from sglang_omni.aio.race import cancel_and_wait
from sglang_omni.errors import BadRequest, ShuttingDown

#: Seconds a new realtime video session waits for the one session slot before it is refused.
SLOT_WAIT_S = 5.0


class SessionSlotTaken(Exception):
    """Another realtime video session holds the one slot (it did not free within
    :data:`SLOT_WAIT_S`)."""


def session_chunks(asked: int | None, most: int) -> int:
    """The chunks a realtime video session runs: ``asked`` (None: ``most``, the setting
    ``server.max_realtime_chunks``); BadRequest (400) when ``asked`` is over ``most``."""
    if asked is not None and asked > most:
        raise BadRequest(f"max_chunks: at most {most} (server.max_realtime_chunks), got "
                         f"{asked}")
    return most if asked is None else asked


class Sessions:
    """The realtime sessions running now; :meth:`close` cancels them at shutdown."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        self._video: set[int] = set()
        self._freed = asyncio.Condition()

    def enter(self) -> bool:
        """Register the current task as a session; False (not registered) once :meth:`close`
        ran: the server is shutting down and the caller must end the connection."""
        if self.closed:
            return False
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        return True

    def leave(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.discard(task)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """Hold a session for the ``async with`` (ShuttingDown once :meth:`close` ran)."""
        if not self.enter():
            raise ShuttingDown()
        try:
            yield
        finally:
            self.leave()

    @contextlib.asynccontextmanager
    async def video_session(self) -> AsyncIterator[None]:
        """Hold the one realtime video slot and a session for the ``async with``:
        SessionSlotTaken when the slot does not free within :data:`SLOT_WAIT_S`, then
        ShuttingDown once :meth:`close` ran."""
        async with self._freed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SLOT_WAIT_S):
                    await self._freed.wait_for(lambda: not self._video)
            if self._video:
                raise SessionSlotTaken()
        async with self.session():
            key = id(asyncio.current_task())
            self._video.add(key)
            try:
                yield
            finally:
                self._video.discard(key)
                async with self._freed:
                    self._freed.notify_all()

    async def close(self) -> None:
        self.closed = True
        # the sessions' errors are retrieved; the caller's own cancellation is not swallowed
        await cancel_and_wait([t for t in self.tasks if not t.done()])
