"""Admission of ``/v1/videos`` jobs: at most :data:`MAX_VIDEO_JOBS` jobs are held (queued,
running or finished and kept for :data:`VIDEO_RETENTION_S`); a new job makes room by forgetting
the oldest finished one, and with none finished it is refused with 503 (``Retry-After``).
A video job takes no ticket of the direct queue (:mod:`.direct`): its client does not wait."""

from __future__ import annotations

from collections.abc import Iterable

from sglang_omni.errors import ServiceUnavailable

MAX_VIDEO_JOBS = 64
VIDEO_RETENTION_S = 3600


def room_for_job(held: int, finished: Iterable[str]) -> str | None:
    """The id of the job to forget so that a new one fits beside the ``held`` jobs (None:
    it fits already); ``finished``: the finished jobs' ids, oldest first. ServiceUnavailable
    (503) when :data:`MAX_VIDEO_JOBS` are held and none finished."""
    if held < MAX_VIDEO_JOBS:
        return None
    oldest = next(iter(finished), None)
    if oldest is None:
        raise ServiceUnavailable(f"{MAX_VIDEO_JOBS} video jobs are queued or running; "
                                 "retry later")
    return oldest
