"""A generated video's two encodes: the client's MP4 and, beside it, the Reasoner's quick copy.

A generation job whose payload sets ``early_video`` (the interleaved adapter does) encodes the
frames twice at once: the client's MP4 at the request's encoding (the job's result), and a quick
copy (x264 at ``media.encode.READER_PRESET``, the same threads) sent as the job's early result
the moment it is ready, so the next Reasoner turn can start while the client's MP4 is still
being encoded. The client's encode does not wait for the copy's; the job's result waits for the
copy to be sent (normally long done, the copy being the quicker encode), so the Reasoner reads
the copy whatever the timing: the same request gives the Reasoner the same bytes. Where the
client's encoding is itself that quick, or the transport takes no early result, no copy is made
and the Reasoner reads the client's MP4.

Every encode reports progress on its job (``encode_progress``: each frame taken in, each packet
written), so a long encode (a slow x264 preset, a long video) is never taken for a hung engine,
and it stops at its next frame once the job is cancelled. An engine that makes its frames one by
one can feed a ``media.encode.Mp4Encoder`` as they come, with the same ``encode_progress``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from sglang_omni.contract.job import Job
from sglang_omni.contract.payloads import MediaResult
from sglang_omni.contract.result import StageResult
from sglang_omni.media.encode import READER_PRESET, Progress, VideoEncoding

#: ``encode(encoding, for_reader)``: the MP4 of the job's frames at ``encoding``, off the event
#: loop; ``for_reader`` says it is the Reasoner's copy (engines may treat it apart).
Encoder = Callable[[VideoEncoding, bool], Awaitable[bytes]]


class EncodeCancelled(Exception):
    """Raised inside an encode (from its progress callback) once its job is cancelled."""


def encode_progress(job: Job) -> Progress:
    """The progress callback of an encode for ``job`` (thread-safe): each call is a sign of
    life (``job.progress()``); once the job is cancelled it raises ``EncodeCancelled``, which
    ends the encode at its next frame or packet instead of when x264 is done."""

    def progress() -> None:
        if job.cancelled.is_set():
            raise EncodeCancelled(f"request {job.rid}: cancelled while its video was encoded")
        job.progress()

    return progress


def wants_reader_copy(job: Job, encoding: VideoEncoding) -> bool:
    """Whether ``job`` asks for an early video and a quicker encode than ``encoding`` exists."""
    return job.payload.get("early_video") is True and job.emit_frames is not None \
        and encoding.slower_than(READER_PRESET)


async def encode_video(job: Job, encode: Encoder, encoding: VideoEncoding) -> bytes:
    """The client's MP4 (``encode(encoding, False)``); where the job wants one
    (``wants_reader_copy``), the Reasoner's copy encoded beside it and sent as the early result
    as soon as it is ready (before this returns, whichever encode ends first). The ``encode``
    span is the wall time of both together. Cancelling it cancels both; an error in either fails
    it."""
    started = time.perf_counter()
    before = job.spans.get("encode", 0.0)

    def spent() -> None:
        job.spans["encode"] = before + time.perf_counter() - started

    client = asyncio.ensure_future(encode(encoding, False))
    reader = asyncio.ensure_future(encode(VideoEncoding(READER_PRESET, encoding.threads), True)) \
        if wants_reader_copy(job, encoding) else None
    try:
        if reader is not None:
            data = await reader
            spent()
            job.send_early(StageResult(MediaResult(
                media=[{"kind": "video", "mime_type": "video/mp4", "frame": 0}],
                reason=None), [data]))
        return await client
    finally:
        pending = [task for task in (client, reader) if task is not None and not task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        spent()
