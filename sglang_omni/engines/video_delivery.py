"""The Reasoner's copy of a generated video, sent ahead of the client's MP4.

A generation job whose payload sets ``early_video`` (the interleaved adapter does) encodes the
frames twice: first quickly (x264 at ``media.encode.READER_PRESET``, the same threads), sent as
the job's early result so the next Reasoner turn can start; then the client's MP4 at the
request's encoding, returned as the job's result. Where the client's encoding is itself that
quick, or the transport takes no early result, nothing is sent early and the Reasoner reads the
client's MP4, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sglang_omni.contract.job import Job
from sglang_omni.contract.payloads import MediaResult
from sglang_omni.contract.result import StageResult
from sglang_omni.media.encode import READER_PRESET, VideoEncoding


def wants_reader_copy(job: Job, encoding: VideoEncoding) -> bool:
    """Whether ``job`` asks for an early video and a quicker encode than ``encoding`` exists."""
    return job.payload.get("early_video") is True and job.emit_frames is not None \
        and encoding.slower_than(READER_PRESET)


async def send_reader_copy(job: Job, encode: Callable[[VideoEncoding], bytes],
                           encoding: VideoEncoding) -> bool:
    """When ``job`` wants one (``wants_reader_copy``): ``encode`` the frames at
    ``READER_PRESET`` off the event loop and send the MP4 as the job's early result. True when
    sent; the caller then encodes the client's MP4 as usual."""
    if not wants_reader_copy(job, encoding):
        return False
    with job.timed("encode"):
        data = await asyncio.to_thread(encode, VideoEncoding(READER_PRESET, encoding.threads))
    return job.send_early(StageResult(MediaResult(
        media=[{"kind": "video", "mime_type": "video/mp4", "frame": 0}], reason=None), [data]))
