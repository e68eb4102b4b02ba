"""A generated video's one MP4, encoded as its frames are made.

An engine hands each batch of frames to a :class:`StreamingMp4` as soon as it exists (the hf
backend: each temporal chunk the VAE decodes; the scripted one: its frames as it draws them);
a worker thread owned by the ``StreamingMp4`` encodes them meanwhile (``media.encode.Mp4Encoder``),
so with x264's ``zerolatency`` tune the MP4 is done about when its last frame is. That MP4 is the
only one: its bytes go to the client and are what the next Reasoner turn reads.

Every encode reports progress on its job (``encode_progress``: each frame taken in, each packet
written), so a long encode (a slow x264 preset, a long video) is never taken for a hung engine,
and it stops at its next frame once the job is cancelled. The job's ``encode`` span is the time
from the last frame handed in to the MP4's bytes (what the encode adds to the generation; the
encoding done while frames were still being made lies within the spans of whatever made them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from collections.abc import Callable, Iterable
from typing import Any

from sglang_omni.aio.threads import Threads
from sglang_omni.contract.job import Job
from sglang_omni.media.encode import Mp4Encoder, Progress, VideoEncoding


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


_ABANDON = object()
#: The encoders' threads: each ends with its encode (``result``, ``abandon``); the stage joins
#: them as it exits, abandoning those still running (``aio.threads.join_all``).
ENCODERS = Threads("video encoders")


class StreamingMp4:
    """One MP4 encoded on its own worker thread while its frames are handed in.

    ``add(frames)`` (from any one thread, in order) queues a batch of frames; ``prepare`` turns
    each batch into RGB uint8 frames on the worker (default: the batch is already such frames,
    an iterable of (height, width, 3) arrays the caller no longer changes). ``finish(sound)``
    says no frame follows (``sound`` as ``Mp4Encoder.finish`` takes it); ``await result()``
    gives the MP4's bytes and adds the time from ``finish`` to them to the job's ``encode``
    span. ``abandon()`` drops the encode (safe at any time, and after ``result``); the worker
    ends after the frame it is encoding. Every ``StreamingMp4`` must end in ``result`` or
    ``abandon`` (``result`` abandons when it is cancelled or fails), so its thread always ends.
    """

    def __init__(self, job: Job, width: int, height: int, fps: int, encoding: VideoEncoding,
                 *, sample_rate: int | None = None, sound_channels: int = 1,
                 prepare: Callable[[Any], Iterable[Any]] | None = None) -> None:
        self.job = job
        self.frames = 0  # handed in so far (batches' lengths)
        self._prepare = prepare or (lambda batch: batch)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._finished_at: float | None = None
        self._encoder_args = (width, height, fps, encoding, sample_rate, sound_channels)
        self._thread = ENCODERS.start(self._work, name=f"mp4-{job.rid}", stop=self.abandon)

    def add(self, frames: Any) -> None:
        """Queue the next batch of frames (a no-op once the encode failed or was dropped)."""
        self.frames += len(frames)
        self._queue.put(("frames", frames))

    def finish(self, sound: Any = None) -> None:
        """No more frames: the worker flushes x264 and closes the MP4 (with ``sound``)."""
        self._finished_at = time.perf_counter()
        self._queue.put(("finish", sound))

    def abandon(self) -> None:
        """Drop the encode: the worker stops after its current frame and frees x264."""
        self._queue.put(_ABANDON)

    async def result(self) -> bytes:
        """The MP4's bytes once ``finish`` was called and x264 is done; cancelling it (or a
        failed encode) abandons the encode. Adds the wait after ``finish`` to ``encode``."""
        try:
            data = await asyncio.wrap_future(self._done)
        except BaseException:
            self.abandon()
            raise
        finally:
            if self._finished_at is not None:
                spans = self.job.spans
                spans["encode"] = spans.get("encode", 0.0) + \
                    time.perf_counter() - self._finished_at
        return data

    def _work(self) -> None:
        width, height, fps, encoding, rate, channels = self._encoder_args
        try:
            with Mp4Encoder(width, height, fps, encoding, sample_rate=rate,
                            sound_channels=channels,
                            progress=encode_progress(self.job)) as encoder:
                while True:
                    item = self._queue.get()
                    if item is _ABANDON:
                        raise EncodeCancelled(f"request {self.job.rid}: video encode dropped")
                    what, value = item
                    if what == "finish":
                        self._done.set_result(encoder.finish(value))
                        return
                    for pixels in self._prepare(value):
                        encoder.add(pixels)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the result
            if not self._done.done():
                self._done.set_exception(exc)
