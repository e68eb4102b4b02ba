"""The native video job routes of direct generation.

``POST /v1/videos`` takes JSON or, as native, a form whose ``input_reference`` and
``video_reference`` are uploads; it answers a job ``{id, object: "video", status: "queued",
progress, size, seconds, ...}``. ``GET /v1/videos[/{id}]`` reads jobs,
``GET /v1/videos/{id}/content`` returns the MP4 once ``status`` is ``completed``, and
``DELETE /v1/videos/{id}`` forgets a job and aborts it if it is still queued or running (native
SGLang cannot abort). Every reference and upload passes the media policy, and the request the
generation limits, before the job exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sglang_omni.contract.generation_options import DEFAULT_FPS
from sglang_omni.errors import BadRequest, NotFound
from sglang_omni.media.admission import admit_media
from sglang_omni.media.refs import check_generation_media
from sglang_omni.serve.bodies.body_formats import accepts
from sglang_omni.serve.bodies.multipart_body import MULTIPART
from sglang_omni.serve.direct.context import DirectContext, single_media
from sglang_omni.serve.direct.fields import (
    DEFAULT_SECONDS,
    VIDEO_FIELDS,
    flatten,
    is_video_source,
    split,
)
from sglang_omni.serve.direct.video_jobs import VideoJob
from sglang_omni.serve.direct.video_listing import MAX_LIMIT, list_page, list_query
from sglang_omni.serve.ops.request_log import note_rid
from sglang_omni.serve.schemas.direct import VIDEO_OPTIONS, VideoGenerationRequest
from sglang_omni.serve.schemas.responses import ERRORS, VideoJobList
from sglang_omni.serve.schemas.responses import VideoJob as VideoJobBody
from sglang_omni.serve.wire.responses import json_response

REFERENCES = ("input_reference", "reference_url", "video_url", "video_reference")
VIDEO_UPLOADS = ("input_reference", "video_reference")


@dataclass(frozen=True)
class VideoPlan:
    """A checked video generation: its prompt, generation options, and job size/seconds."""

    prompt: str
    options: dict[str, Any]
    size: str
    seconds: str
    #: ``(label, reference)`` of every media reference, labelled by the client's field.
    media: tuple[tuple[str, str], ...] = ()


def plan_video(ctx: DirectContext, fields: dict[str, Any], options: dict[str, Any]) -> VideoPlan:
    """The generation a video request asks for; 400 (media policy, options, limits) before any
    work. ``fields``/``options`` are :func:`~sglang_omni.serve.direct.fields.split`'s."""
    named: dict[str, str] = {}  # reference -> the client's field that gave it
    for key in REFERENCES:
        ref = fields.get(key)
        if ref is None:
            continue
        if not isinstance(ref, str):
            raise BadRequest(f"{key}: expected a media path or URL string")
        ctx.policy.check(ref, label=key)
        named.setdefault(ref, key)
        target = "video_path" if key in ("video_url", "video_reference") or is_video_source(ref) \
            else "image_path"
        options.setdefault(target, ref)
    if options.get("action_mode") not in (None, "forward_dynamics"):
        raise BadRequest("action_mode: action-producing policy and inverse-dynamics "
                         "requests use /v1/actions/generations; /v1/videos is for videos")
    media = tuple((named.get(ref, label), ref)
                  for label, ref in check_generation_media(options, ctx.policy))
    fps = options.setdefault("fps", DEFAULT_FPS)
    seconds = DEFAULT_SECONDS if fields.get("seconds") is None else fields["seconds"]
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        raise BadRequest(f"seconds: expected a positive integer, got {seconds!r}")
    if "action_horizon" in options:  # forward dynamics: one frame per action, plus one
        options.setdefault("num_frames", options["action_horizon"] + 1)
    frames = options.setdefault("num_frames", fps * seconds)
    ctx.model.check_generation_limits(options, ctx.settings, video=True, backend=ctx.backend,
                                      multiple=ctx.multiple)
    width, height = ctx.model.default_size(ctx.backend)  # what the engine makes of a side left out
    size = f"{options.get('width', width)}x{options.get('height', height)}"
    return VideoPlan(fields["prompt"], options, size, str(round(frames / fps)), media)


def add_video_routes(router: APIRouter, ctx: DirectContext) -> None:
    """The video job routes; the jobs are ``ctx.videos``."""
    videos = ctx.videos

    @router.post("/v1/videos", openapi_extra=accepts(MULTIPART, uploads=VIDEO_UPLOADS),
                 responses={200: {"model": VideoJobBody}, **ERRORS})
    async def create_video(body: VideoGenerationRequest) -> Response:
        """Create a video job (JSON or a form); poll ``GET /v1/videos/{id}``, then fetch its
        content."""
        fields, options = split(flatten(body, ctx.settings), VIDEO_FIELDS, VIDEO_OPTIONS,
                                "/v1/videos")
        plan = plan_video(ctx, fields, options)
        await admit_media(plan.media, ctx.policy)
        # the job's state: its id, and its media (the stage reads them as it runs) held until
        # the job ends; released by the door as the job's task ends
        state = ctx.door.open_job(ref for _, ref in plan.media)
        assert state.rid is not None
        note_rid(state.rid)
        job = VideoJob(state.rid, fields.get("model") or ctx.served_name, plan.size,
                       plan.seconds)
        response = json_response(job.body())  # answerable before it is stored

        async def work(job: VideoJob) -> tuple[bytes, float]:
            result = await ctx.door.run_job(state, {"modality": "video", "prompt": plan.prompt,
                                                    "options": plan.options},
                                            on_chunk=job.on_progress)
            return single_media("video", result), result.engine_s

        try:
            videos.start(job, work)
        except BaseException:
            ctx.door.end_job(state, refused=True)
            raise
        assert job.task is not None
        job.task.add_done_callback(lambda _task: ctx.door.end_job(state))
        return response

    @router.get("/v1/videos", responses={200: {"model": VideoJobList}})
    async def list_videos(
            after: str | None = Query(None, description="list the jobs after this one"),
            limit: str | None = Query(None, description=f"at most this many jobs (1 to "
                                      f"{MAX_LIMIT}; default: every job held)"),
            order: str | None = Query(None, description="'desc' (newest first, the default) "
                                      "or 'asc' (by created_at, then id)")) -> Response:
        """The jobs held, newest first (by `created_at`, then `id`). Query parameters, as
        native's: `limit` (1 to 100) lists at most that many (`has_more` says whether more are
        held), `after` (a job id) the jobs after that one, `order=asc` oldest first."""
        given = {"after": after, "limit": limit, "order": order}
        query = list_query({k: v for k, v in given.items() if v is not None})
        videos.expire()
        return json_response(list_page([job.body() for job in videos.jobs.values()], query))

    @router.get("/v1/videos/{video_id}", responses={200: {"model": VideoJobBody}})
    async def retrieve_video(video_id: str) -> Response:
        return json_response(videos.get(video_id).body())

    @router.get("/v1/videos/{video_id}/content",
                responses={200: {"content": {"video/mp4": {}}, "description": "the MP4"}})
    async def video_content(video_id: str) -> Response:
        job = videos.get(video_id)
        if job.error is not None:
            raise NotFound(f"video {video_id!r} failed: {job.error['message']}")
        if job.data is None:
            raise NotFound(f"video {video_id!r} is still {job.status.replace('_', ' ')}; poll "
                           "GET /v1/videos/{id} until its status is completed")
        return Response(job.data, media_type="video/mp4", headers={
            "Content-Disposition": f'attachment; filename="{video_id}.mp4"'})

    @router.delete("/v1/videos/{video_id}", responses={200: {"model": VideoJobBody}})
    async def delete_video(video_id: str) -> Response:
        job = videos.pop(video_id)
        return json_response({**job.body(), "status": "deleted"})
