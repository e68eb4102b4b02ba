"""``/v1/videos`` jobs: held in memory, each running job's task owned by :class:`VideoJobs`.

A finished video is held until it is deleted or :data:`VIDEO_RETENTION_S` passes; at most
:data:`MAX_VIDEO_JOBS` jobs are held (the admission rule of
:mod:`sglang_omni.pipeline.admission.video_jobs`). ``DELETE`` of a queued or running job
cancels its task, which aborts the generation on the stage. :meth:`VideoJobs.close` (server
shutdown) cancels every running job and waits for it to end.

A job remembers the call it was made in (:data:`CALL_TAG`, set by whoever runs the app for a
caller that may never receive the answer: a Ray Serve replica, for its gateway's fenced calls);
:func:`drop_jobs_of` cancels and forgets the jobs of a call whose answer never left, so no job
is held that no client knows the id of.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.aio.race import to_the_end
from sglang_omni.errors import NotFound, OmniError, ServerError, ShuttingDown
from sglang_omni.pipeline.admission.video_jobs import (
    MAX_VIDEO_JOBS,
    VIDEO_RETENTION_S,
    room_for_job,
)
from sglang_omni.serve.wire.http_errors import GENERIC_500

log = logging.getLogger("sglang_omni.serve")

__all__ = ["CALL_TAG", "MAX_VIDEO_JOBS", "VIDEO_RETENTION_S", "VideoJob", "VideoJobs",
           "drop_jobs_of"]
#: The call a job is made in (None: a plain server's request, whose answer is its client's).
CALL_TAG: ContextVar[str | None] = ContextVar("sgl_omni_video_call", default=None)


@dataclass
class VideoJob:
    """One ``/v1/videos`` job, as the native video route reports it."""

    id: str
    model: str
    size: str
    seconds: str
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "queued"
    progress: int = 0
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict[str, Any] | None = None
    inference_time_s: float | None = None
    data: bytes | None = field(default=None, repr=False)
    task: asyncio.Task | None = field(default=None, repr=False)
    call_tag: str | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed")

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status,
                "progress": self.progress, "created_at": self.created_at, "size": self.size,
                "seconds": self.seconds, "quality": "standard", "url": None,
                "completed_at": self.completed_at, "expires_at": self.expires_at,
                "error": self.error, "inference_time_s": self.inference_time_s}

    def on_progress(self, chunk: dict[str, Any]) -> None:
        step, steps = chunk.get("step"), chunk.get("steps")
        if self.status == "queued":
            self.status = "in_progress"
        if isinstance(step, int) and isinstance(steps, int) and steps > 0:
            self.progress = min(99, 100 * step // steps)

    def finish(self, *, data: bytes | None = None, error: OmniError | None = None,
               engine_s: float | None = None) -> None:
        self.completed_at = int(time.time())
        self.expires_at = self.completed_at + VIDEO_RETENTION_S
        if error is not None:
            self.status = "failed"
            self.error = error.to_body()["error"]
            return
        self.status, self.progress, self.data = "completed", 100, data
        self.inference_time_s = engine_s


#: Runs a job's generation: returns the MP4 bytes and the engine time; raises OmniError.
VideoWork = Callable[[VideoJob], Awaitable[tuple[bytes, float]]]


class VideoJobs:
    """The jobs held in memory, oldest first; this object owns every running job's task."""

    def __init__(self) -> None:
        self.jobs: OrderedDict[str, VideoJob] = OrderedDict()
        self._closed = False
        #: Tasks of jobs forgotten (deleted) while running: cancelled, still ending (their
        #: generation's abort on the stage); ``close`` waits for them too.
        self._ending: set[asyncio.Task[None]] = set()
        _owners.add(self)

    def expire(self) -> None:
        """Forget finished jobs older than their retention."""
        now = time.time()
        for job in [j for j in self.jobs.values() if j.expires_at and j.expires_at <= now]:
            del self.jobs[job.id]

    def start(self, job: VideoJob, work: VideoWork) -> None:
        """Hold ``job`` and run ``work`` for it in a task of this owner (503 when full or
        shutting down)."""
        if self._closed:
            raise ShuttingDown()
        self.expire()
        oldest = room_for_job(len(self.jobs), (j.id for j in self.jobs.values() if j.finished))
        if oldest is not None:
            del self.jobs[oldest]
        job.call_tag = CALL_TAG.get()
        self.jobs[job.id] = job
        job.task = asyncio.create_task(self._run(job, work), name=f"video-job-{job.id}")

    @staticmethod
    async def _run(job: VideoJob, work: VideoWork) -> None:
        try:
            data, engine_s = await work(job)
            job.finish(data=data, engine_s=engine_s)
        except OmniError as exc:
            job.finish(error=exc)
        except Exception:  # noqa: BLE001 - a bug fails the job, not the server
            log.exception("video job %s failed unexpectedly", job.id)
            job.finish(error=ServerError(GENERIC_500))

    def get(self, video_id: str) -> VideoJob:
        self.expire()
        job = self.jobs.get(video_id)
        if job is None:
            raise NotFound(f"video {video_id!r} not found (deleted, expired after "
                           f"{VIDEO_RETENTION_S} s, or never created)")
        return job

    def pop(self, video_id: str) -> VideoJob:
        """Forget a job; a queued or running one is cancelled (its generation aborted)."""
        job = self.get(video_id)
        del self.jobs[video_id]
        if job.task is not None and not job.task.done():
            job.task.cancel()
            self._ending.add(job.task)
            job.task.add_done_callback(self._ending.discard)
        return job

    async def close(self) -> None:
        """Shutdown: refuse new jobs, cancel the running ones and wait for them to end."""
        self._closed = True
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        # the ending ones were cancelled already (a second cancel would cut their cleanup short);
        # the caller's own cancellation is not swallowed, only raised once they all ended
        ending = [*tasks, *self._ending]
        if ending:
            await to_the_end(asyncio.gather(*ending, return_exceptions=True))


_owners: weakref.WeakSet[VideoJobs] = weakref.WeakSet()


def drop_jobs_of(call_tag: str) -> int:
    """Cancel and forget every job made in call ``call_tag`` (its answer never reached its
    client); how many there were."""
    dropped = 0
    for owner in list(_owners):
        for job in [j for j in owner.jobs.values() if j.call_tag == call_tag]:
            owner.pop(job.id)
            dropped += 1
    return dropped
