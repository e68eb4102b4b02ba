"""``VideoJobs`` owns every running video job: shutdown cancels and awaits them, and refuses
new ones; a failed job reports its error; a bug fails the job with the generic message."""

from __future__ import annotations

import asyncio

import pytest

from sglang_omni.errors import BadRequest, ServiceUnavailable
from sglang_omni.serve.direct.video_jobs import VideoJob, VideoJobs
from sglang_omni.serve.wire.http_errors import GENERIC_500


def job(name: str) -> VideoJob:
    return VideoJob(name, "m", "64x64", "1")


def test_close_cancels_running_jobs_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        jobs = VideoJobs()
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def forever(_: VideoJob) -> tuple[bytes, float]:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return b"", 0.0

        jobs.start(job("a"), forever)
        await started.wait()
        await asyncio.wait_for(jobs.close(), 5)
        assert cancelled.is_set()
        assert all(j.task is not None and j.task.done() for j in jobs.jobs.values())
        with pytest.raises(ServiceUnavailable, match="shutting down"):
            jobs.start(job("b"), forever)

    asyncio.run(scenario())


def test_jobs_finish_with_their_result_or_error() -> None:
    async def scenario() -> None:
        jobs = VideoJobs()

        async def ok(_: VideoJob) -> tuple[bytes, float]:
            return b"mp4", 1.5

        async def refused(_: VideoJob) -> tuple[bytes, float]:
            raise BadRequest("width: too wide")

        async def bug(_: VideoJob) -> tuple[bytes, float]:
            raise KeyError("internal detail")

        for name, work in (("ok", ok), ("refused", refused), ("bug", bug)):
            jobs.start(job(name), work)
        await asyncio.gather(*(j.task for j in jobs.jobs.values() if j.task is not None))
        assert jobs.get("ok").status == "completed" and jobs.get("ok").data == b"mp4"
        assert jobs.get("refused").error == {"message": "width: too wide",
                                             "type": "invalid_request_error", "code": 400}
        assert jobs.get("bug").error is not None
        assert jobs.get("bug").error["message"] == GENERIC_500
        assert "internal detail" not in str(jobs.get("bug").body())

    asyncio.run(scenario())


def test_close_waits_for_a_deleted_job_still_ending() -> None:
    """A job deleted while running is cancelled, and its generation's abort may take a while on
    the stage: shutdown still waits for it (the owner keeps its task until it ended)."""
    async def scenario() -> None:
        jobs = VideoJobs()
        started, ended = asyncio.Event(), asyncio.Event()

        async def slow_abort(_: VideoJob) -> tuple[bytes, float]:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.3)  # the stage ends the aborted generation
                ended.set()
                raise
            return b"", 0.0

        jobs.start(job("a"), slow_abort)
        await started.wait()
        jobs.pop("a")
        await asyncio.wait_for(jobs.close(), 5)
        assert ended.is_set()

    asyncio.run(scenario())
