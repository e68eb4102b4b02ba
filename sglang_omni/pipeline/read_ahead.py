"""Ending an async iterator that is read ahead of its consumer.

:func:`~sglang_omni.pipeline.progress.with_progress` and
:func:`~sglang_omni.serve.wire.sse.with_keepalive` race the next item of ``events`` against
something
else (a progress event, a keep-alive timer), so a read of ``events`` may be pending when their
consumer stops. :func:`end_read_ahead` is how both end: no task outlives the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


async def end_read_ahead(events: AsyncIterator[Any], pending: asyncio.Future[Any] | None
                         ) -> None:
    """Cancel ``pending`` (the read of ``events`` in flight, if any) and wait for it: the
    CancelledError it raises inside ``events`` ends that iterator; a cancel scope may interrupt
    the wait again, and the task still ends promptly. ``events`` is closed unless that read
    ended it (it was suspended at a yield, or no read was pending)."""
    ended = False
    if pending is not None:
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({pending})
        ended = not pending.done() or pending.cancelled() or \
            pending.exception() is not None  # (retrieved, so never reported unretrieved)
    if not ended:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
