"""Consume a stage call as an async stream of chunks followed by its result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.runtime.stage.handle import StageHandle

_DONE = object()


async def stream_call(handle: StageHandle, rid: str, payload: Mapping[str, Any],
                      frames: Frames | None = None) -> AsyncIterator[dict[str, Any] | StageResult]:
    """Yield each chunk dict, then the ``StageResult``; errors of the call are raised.

    Closing or cancelling the iterator aborts the job on the stage.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.create_task(handle.call(rid, payload, frames, on_chunk=queue.put_nowait))
    task.add_done_callback(lambda _: queue.put_nowait(_DONE))
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                break
            yield item
        yield task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
