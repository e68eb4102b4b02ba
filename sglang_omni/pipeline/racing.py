"""Await work unless an event comes first: the one race the orchestrator and its planner run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def work_unless(work: Awaitable[T], event: asyncio.Event) -> asyncio.Future[T]:
    """Run ``work`` until it ends or ``event`` is set, whichever is first; ``work`` still
    running then is cancelled and awaited. Returns its task, done (a result, an exception, or
    cancelled); cancelling the caller cancels ``work`` too."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif not task.cancelled():
            task.exception()  # seen here: the caller, if cancelled meanwhile, never reads it
    return task
