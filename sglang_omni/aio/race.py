"""``race``: the one way Omni runs "X until Y, cancel the loser".

Every contender runs as a task; when the first ends, the others are cancelled and awaited
before ``race`` returns, so no task outlives it and no exception goes unretrieved. Cancelling
the caller cancels and awaits them all. The winner's outcome is the caller's: its value is
returned with its index, its exception is raised, and a winner that ended cancelled by itself
(not by the caller) raises ``CancelledError``, as awaiting it directly would.

A contender is owned by the race: pass ``event.wait()`` or ``asyncio.shield(shared)`` for
something others also wait on (a future awaited here is cancelled when it loses).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("sglang_omni.aio")
T = TypeVar("T")


@dataclass(frozen=True)
class Finish:
    """The first contender to end: its position in the call and its value."""

    index: int
    value: Any


async def race(*contenders: Awaitable[Any]) -> Finish:
    """Run ``contenders`` until the first ends; cancel and await the rest (see the module
    docstring). Contenders that ended in the same step: the first in call order wins, so put
    the one whose result must not be lost first."""
    if not contenders:
        raise ValueError("race needs at least one contender")
    tasks = [asyncio.ensure_future(contender) for contender in contenders]
    ended: list[bool] = []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        ended = [task.done() for task in tasks]
    finally:
        await cancel_and_wait(tasks)
    index = ended.index(True)
    for i, task in enumerate(tasks):  # a loser that failed as it was cancelled: say so
        if i != index and not ended[i] and not task.cancelled() \
                and task.exception() is not None:
            log.warning("a task cancelled after losing a race failed: %r", task.exception())
    return Finish(index, tasks[index].result())


async def cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the tasks not done and wait until all have ended; their exceptions are
    retrieved (never logged as unretrieved). A caller cancelled meanwhile is still cancelled,
    once they all ended."""
    for task in tasks:
        task.cancel()
    if tasks:
        await to_the_end(asyncio.gather(*tasks, return_exceptions=True))


async def to_the_end(work: Awaitable[T]) -> T:
    """``work``'s result, awaited to its end even if the caller is cancelled meanwhile (the
    caller's cancellation is raised once it ended): cleanup is never left half done."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what it hears
        raise asyncio.CancelledError()
    return task.result()
