"""Stage calls that may answer early.

A job may send an early result (``contract.job.EARLY_RESULT``: the Reasoner's copy of a video,
``engines.video_delivery``) before its final one. :func:`call_until_early` returns that early
result at once, its ``later`` the task that finishes the job; the task is added to ``owner``
until it ends, so whoever holds the request can cancel it (which aborts the job on its stage).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from sglang_omni.contract.job import CHUNK_FRAMES, EARLY_RESULT, clean_spans
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.runtime.stage_handle import StageHandle


async def call_until_early(handle: StageHandle, rid: str, payload: Mapping[str, Any],
                           frames: Frames, on_chunk: Callable[[dict[str, Any]], None],
                           owner: set[asyncio.Task[StageResult]]) -> StageResult:
    """``handle.call``, returning as soon as the job sends an early result (with ``later``
    set); other chunks go to ``on_chunk``. Cancelling it aborts the job."""
    early: asyncio.Future[StageResult] = asyncio.get_running_loop().create_future()

    def chunk(data: dict[str, Any]) -> None:
        if EARLY_RESULT not in data:
            on_chunk(data)
        elif not early.done():
            spans = clean_spans(data.get("spans"))  # the job's time until it sent this
            early.set_result(StageResult(dict(data[EARLY_RESULT] or {}),
                                         list(data.get(CHUNK_FRAMES) or []),
                                         sum(spans.values()), handle.name, spans=spans))

    job = asyncio.ensure_future(handle.call(rid, payload, frames, on_chunk=chunk))
    try:
        await asyncio.wait({job, early}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)  # the abort reached the stage
        raise
    if job.done() or not early.done():
        return await job
    owner.add(job)
    job.add_done_callback(_settled(owner))
    return replace(early.result(), later=job)


def _settled(owner: set[asyncio.Task[StageResult]]
             ) -> Callable[[asyncio.Task[StageResult]], None]:
    def done(task: asyncio.Task[StageResult]) -> None:
        owner.discard(task)
        if not task.cancelled():
            task.exception()  # its awaiter reports it; nobody else logs it as unretrieved
    return done
