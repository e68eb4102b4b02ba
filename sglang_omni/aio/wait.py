"""``wait_set``: the one way Omni waits for an ``asyncio.Event`` with a time limit.

Python 3.11's ``asyncio.wait_for`` swallows a cancellation that lands in the same loop step as
the awaited thing's completion (it returns the result instead of raising ``CancelledError``), so
a task cancelled at that moment runs on. ``asyncio.timeout`` counts its own cancellation apart
from the caller's, so a cancellation of the waiting task always propagates from here.
"""

from __future__ import annotations

import asyncio


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s`` seconds; raises ``CancelledError`` when
    the waiting task is cancelled, even if the event is set in the same step."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
