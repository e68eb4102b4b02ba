"""Ending an async iterator that is read ahead of its consumer.

:func:`~sglang_omni.pipeline.progress.with_progress` and
:func:`~sglang_omni.serve.wire.sse.with_keepalive` race the next item of ``events`` against
something else (a progress event, a keep-alive timer), so a read of ``events`` may be pending
when their consumer stops. :func:`end_read_ahead` is how both end: no task outlives the
consumer, and ``events`` has ended when it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sglang_omni.aio.race import to_the_end


async def end_read_ahead(events: AsyncIterator[Any], pending: asyncio.Future[Any] | None
                         ) -> None:
    """Cancel ``pending`` (the read of ``events`` in flight, if any) and wait until it ended:
    the CancelledError it raises inside ``events`` ends that iterator. ``events`` is closed
    unless that read ended it (it was suspended at a yield, or no read was pending).

    The wait lasts to the read's end even when the caller is cancelled again meanwhile (a
    cancel scope, such as the one a streaming response's client disconnect cancels, repeats
    its cancellation): returning earlier left ``events`` running in the read's task, and its
    owner then closing it failed ("aclose(): asynchronous generator is already running"). The
    caller's cancellation is raised once ``events`` ended."""
    ended, cancelled = False, False
    if pending is not None:
        pending.cancel()
        while not pending.done():
            try:
                await asyncio.wait({pending})
            except asyncio.CancelledError:
                cancelled = True  # raised below, once the read ended
        ended = pending.cancelled() or pending.exception() is not None  # (retrieved)
    if not ended:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            try:
                await to_the_end(aclose())
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError()
