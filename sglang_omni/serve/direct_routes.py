"""Direct generation (``Cosmos3PipelineConfig``): the native image, video and action routes.

The shapes are those of the pinned SGLang release's own routes, with JSON bodies:

* ``POST /v1/images/generations``: ``{id, created, data: [{b64_json, revised_prompt}],
  inference_time_s}``.
* ``POST /v1/videos``: a job ``{id, object: "video", status: "queued", progress, size, seconds,
  ...}``; ``GET /v1/videos[/{id}]`` reads jobs, ``GET /v1/videos/{id}/content`` returns the MP4
  once ``status`` is ``completed``, ``DELETE /v1/videos/{id}`` forgets a job and aborts it if it
  is still queued or running (native SGLang cannot abort here).
* ``POST /v1/actions/generations``: the native action route's body and response.

Bodies are the typed models of :mod:`sglang_omni.serve.schemas.direct`. Omni keeps no files:
images come back as ``b64_json`` only, and videos are held by
:class:`~sglang_omni.serve.video_jobs.VideoJobs`. The generation stage reads
``image_path``/``video_path`` and action media
under the media policy, which is checked here first (400 before any model work), as are the
server's generation limits (``models.cosmos3.generation_limits``) and the action route's field
types (``models.cosmos3.action_request``). Engine exception text never reaches a client: an
unexpected failure answers the generic 500 and is logged.
"""

from __future__ import annotations

import base64
import logging
import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sglang_omni.config.server import ServerSettings
from sglang_omni.engines.generation_options import DEFAULT_FPS, check_option_value
from sglang_omni.engines.result import StageResult
from sglang_omni.errors import BadRequest, NotFound, ServerError
from sglang_omni.media.action_refs import action_media_refs
from sglang_omni.media.refs import check_generation_options, check_media_refs
from sglang_omni.models.cosmos3.action_request import action_options, check_action_request
from sglang_omni.models.cosmos3.generation_limits import (
    ACTION_DEFAULTS,
    check_generation_limits,
    size_multiple,
)
from sglang_omni.pipeline.media_checks import check_generated_media
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.mode_routes import ModeRoutes, refuse_chat, refuse_generate
from sglang_omni.serve.request_body import parse_json
from sglang_omni.serve.responses import json_response, json_response_off_loop
from sglang_omni.serve.schemas.direct import (
    IMAGE_OPTIONS,
    VIDEO_OPTIONS,
    ActionGenerationRequest,
    ImageGenerationRequest,
    VideoGenerationRequest,
)
from sglang_omni.serve.schemas.responses import (
    ERRORS,
    ImageGenerationResponse,
    VideoJobList,
)
from sglang_omni.serve.schemas.responses import (
    VideoJob as VideoJobBody,
)
from sglang_omni.serve.typed_route import omni_router
from sglang_omni.serve.video_jobs import VideoJob, VideoJobs

log = logging.getLogger("sglang_omni.serve")

DEFAULT_SECONDS = 4  # the native video route's default length
VIDEO_EXTENSIONS = (".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".webm")

IMAGE_FIELDS = ("prompt", "n", "size", "response_format", "output_format", "model", "user")
VIDEO_FIELDS = ("prompt", "n", "num_outputs_per_prompt", "seconds", "size", "model", "user",
                "input_reference", "reference_url", "video_url")
STRING_FIELDS = ("model", "user", "size", "response_format", "output_format")
NOT_HERE = ("output_path", "output_file_name", "save_output", "return_frames",
            "return_file_paths_only")


# --- request bodies ----------------------------------------------------------------------------
def _flatten(body: Any) -> dict[str, Any]:
    """The fields of a validated body, with ``extra_params``/``extra_body`` fields and
    ``guardrails`` promoted, as native does."""
    out = body.model_dump(exclude_unset=True)
    for container in ("extra_params", "extra_body"):
        extra = out.pop(container, None)
        if isinstance(extra, str):
            try:  # the same checks as the body itself
                extra = parse_json(extra.encode(), ServerSettings.max_json_depth)
            except BadRequest as exc:
                raise BadRequest(f"{container}: expected a JSON object; {exc.message}") from None
        if extra is None:
            continue
        if not isinstance(extra, dict):
            raise BadRequest(f"{container}: expected a JSON object")
        for key, value in extra.items():
            out.setdefault(key, value)
    if "guardrails" in out:
        out.setdefault("use_guardrails", out.pop("guardrails"))
    return out


def _split(body: dict[str, Any], fields: tuple[str, ...], options: tuple[str, ...],
           route: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The route fields and the generation options of a body; 400 naming a wrong field."""
    route_fields: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    for key, value in body.items():
        if key in NOT_HERE:
            raise BadRequest(f"{key}: SGLang Omni returns generated media itself and manages "
                             "the native output folders; remove it")
        if key in fields:
            route_fields[key] = value
        elif key in options:
            if value is not None:
                check_option_value(key, key, value)
                opts[key] = value
        else:
            raise BadRequest(f"{key}: not a field of {route} on this server; accepted: "
                             f"{', '.join(sorted((*fields, *options)))}")
    prompt = route_fields.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt: required, a string")
    for key in STRING_FIELDS:
        if route_fields.get(key) is not None and not isinstance(route_fields[key], str):
            raise BadRequest(f"{key}: expected a string, got {type(route_fields[key]).__name__}")
    for key in ("n", "num_outputs_per_prompt"):
        if route_fields.get(key) not in (None, 1):
            raise BadRequest(f"{key}: each generation returns exactly one media item; leave it "
                             "at 1")
    size = route_fields.get("size")
    if size:
        width, sep, height = str(size).lower().partition("x")
        if not sep or not width.isdigit() or not height.isdigit() or not int(width) \
                or not int(height):
            raise BadRequest(f"size: expected WIDTHxHEIGHT, got {size!r}")
        opts.setdefault("width", int(width))
        opts.setdefault("height", int(height))
    return route_fields, opts


def _is_video_source(ref: Any) -> bool:
    if not isinstance(ref, str):
        return False
    if ref.startswith("data:"):
        return ref[5:].startswith("video/")
    return ref.split("?", 1)[0].split("#", 1)[0].lower().endswith(VIDEO_EXTENSIONS)


# --- results -----------------------------------------------------------------------------------
def single_media(kind: str, result: StageResult) -> bytes:
    """The one ``kind`` item a generation returned; ServerError (500) otherwise. The inline
    limit of interleaved media does not apply: direct routes hold their media themselves."""
    data, _ = check_generated_media(kind, result.payload, result.frames, inline_limit=None)
    return bytes(data)


# --- routes ------------------------------------------------------------------------------------
def direct_routes(orchestrator: Orchestrator, served_name: str) -> ModeRoutes:
    """The direct generation routes over ``orchestrator``'s generation stage; the video jobs
    are owned by the returned routes (closed at shutdown)."""
    router = omni_router()
    videos = VideoJobs()
    policy = orchestrator.policy
    settings = orchestrator.config.server
    multiple = size_multiple(orchestrator.config.stage("generation").factory.get("backend"))

    def stage() -> Any:
        orchestrator.check_healthy()
        return orchestrator.stages["generation"]

    async def call(request: Request, rid: str, payload: dict[str, Any]) -> StageResult | None:
        """Run a generation for a waiting client; None when the client went away (aborted)."""
        try:
            return await until_disconnect(request, stage().call(rid, payload))
        except ClientDisconnected:
            return None

    @router.post("/v1/images/generations", responses={200: {"model": ImageGenerationResponse},
                                                      **ERRORS})
    async def image_generations(request: Request, body: ImageGenerationRequest) -> Response:
        """Generate one image (PNG, returned as ``b64_json``)."""
        fields, options = _split(_flatten(body), IMAGE_FIELDS, IMAGE_OPTIONS,
                                 "/v1/images/generations")
        if fields.get("response_format") not in (None, "b64_json"):
            raise BadRequest("response_format: SGLang Omni keeps no copies of generated media, "
                             "so images come back as b64_json only")
        if fields.get("output_format") not in (None, "png"):
            raise BadRequest("output_format: native Cosmos3 writes PNG images; use png")
        check_generation_limits(options, settings, video=False, multiple=multiple)
        rid = orchestrator.ids.new()
        result = await call(request, rid, {"modality": "image", "prompt": fields["prompt"],
                                           "options": options})
        if result is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        data = single_media("image", result)
        return await json_response_off_loop(lambda: {  # base64 of the image: off the loop
            "id": rid, "created": int(time.time()),
            "data": [{"b64_json": base64.b64encode(data).decode(),
                      "revised_prompt": fields["prompt"]}],
            "inference_time_s": result.engine_s})

    @router.post("/v1/videos", responses={200: {"model": VideoJobBody}, **ERRORS})
    async def create_video(body: VideoGenerationRequest) -> Response:
        """Create a video job; poll ``GET /v1/videos/{id}``, then fetch its content."""
        fields, options = _split(_flatten(body), VIDEO_FIELDS, VIDEO_OPTIONS, "/v1/videos")
        for key in ("input_reference", "reference_url", "video_url"):
            ref = fields.get(key)
            if ref is None:
                continue
            if not isinstance(ref, str):
                raise BadRequest(f"{key}: expected a media path or URL string")
            policy.check(ref, label=key)
            target = "video_path" if key == "video_url" or _is_video_source(ref) \
                else "image_path"
            options.setdefault(target, ref)
        if options.get("action_mode") not in (None, "forward_dynamics"):
            raise BadRequest("action_mode: action-producing policy and inverse-dynamics "
                             "requests use /v1/actions/generations; /v1/videos is for videos")
        check_generation_options(options, policy)
        fps = options.setdefault("fps", DEFAULT_FPS)
        seconds = DEFAULT_SECONDS if fields.get("seconds") is None else fields["seconds"]
        if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
            raise BadRequest(f"seconds: expected a positive integer, got {seconds!r}")
        if "action_horizon" in options:  # forward dynamics: one frame per action, plus one
            options.setdefault("num_frames", options["action_horizon"] + 1)
        frames = options.setdefault("num_frames", fps * seconds)
        check_generation_limits(options, settings, video=True, multiple=multiple)
        size = f"{options['width']}x{options['height']}" if "width" in options \
            and "height" in options else ""
        handle = stage()
        job = VideoJob(orchestrator.ids.new(), fields.get("model") or served_name, size,
                       str(round(frames / fps)))
        response = json_response(job.body())  # answerable before it is stored

        async def work(job: VideoJob) -> tuple[bytes, float]:
            result = await handle.call(job.id, {"modality": "video", "prompt": fields["prompt"],
                                                 "options": options},
                                       on_chunk=job.on_progress)
            return single_media("video", result), result.engine_s

        videos.start(job, work)
        return response

    @router.get("/v1/videos", responses={200: {"model": VideoJobList}})
    async def list_videos() -> Response:
        """The jobs held, newest first."""
        videos.expire()
        data = [job.body() for job in reversed(videos.jobs.values())]
        return json_response({"object": "list", "data": data,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None, "has_more": False})

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

    @router.post("/v1/actions/generations", responses=ERRORS)
    async def action_generations(request: Request, raw: ActionGenerationRequest) -> Response:
        """The native action route: the response is native's action generation body."""
        body = check_action_request(raw.model_dump(exclude_unset=True), policy.check)
        check_media_refs(action_media_refs(body), policy)  # the request-wide count and bytes
        check_generation_limits(action_options(body), settings, video=True,
                                defaults=ACTION_DEFAULTS, multiple=multiple)
        rid = orchestrator.ids.new()
        result = await call(request, rid, {"modality": "action", "request": body})
        if result is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        response = result.payload.get("action")
        if not isinstance(response, dict):
            raise ServerError("the action generation returned no action")
        if response.get("object") == "action.generation":
            response = {**response, "model": served_name}
        return await json_response_off_loop(lambda: response)

    refuse_chat(router, "/v1/chat/completions: this server runs Cosmos3PipelineConfig (direct "
                "generation); use the image, video and action routes")
    refuse_generate(router, orchestrator.config.config_cls)
    return ModeRoutes(router, closers=(videos.close,))
