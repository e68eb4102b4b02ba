"""The native action routes of direct generation.

* ``POST /v1/actions/generations``: JSON, a form (:mod:`.action_form`) or msgpack, as native.
  The answer is native's envelope (``runtime.response_format`` ``envelope``, the default) or
  the model's raw output (``raw``); msgpack when the request is msgpack or its ``Accept`` asks for
  it (action values then travel as native's float32 array maps).
* ``GET /v1/actions/metadata``: the served model's ``action_metadata``.
* ``WS /v1/actions/realtime``: :mod:`.realtime_actions` (the same checks and answers).

Every body is checked before any work (field types, the media policy over every media value,
uploads included, and the generation limits) by the served model
(``contract.model.ServedModel``: Cosmos3's is :mod:`sglang_omni.models.cosmos3.model`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sglang_omni.contract.result import StageResult
from sglang_omni.errors import ServerError
from sglang_omni.media.action_refs import action_inline_images, action_media_refs
from sglang_omni.media.admission import admit_media
from sglang_omni.media.refs import check_media_refs
from sglang_omni.serve.bodies.action_form import UPLOADS, action_body_from_form
from sglang_omni.serve.bodies.body_formats import accepts
from sglang_omni.serve.bodies.msgpack_body import (
    MSGPACK,
    pack_msgpack,
    wants_msgpack,
    with_native_arrays,
)
from sglang_omni.serve.bodies.multipart_body import MULTIPART
from sglang_omni.serve.direct.context import DirectContext
from sglang_omni.serve.schemas.direct import ActionGenerationRequest
from sglang_omni.serve.schemas.responses import ERRORS
from sglang_omni.serve.wire.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.wire.responses import json_response, json_response_off_loop


def check_action(ctx: DirectContext, body: dict[str, Any]) -> dict[str, Any]:
    """A checked action body (400 before any work). A client ``request_id``/``id`` is dropped:
    Omni names each request itself (unique among requests in flight; the answer's ``id``)."""
    checked = ctx.model.check_action_request(body, ctx.policy.check)
    checked.pop("request_id", None)
    checked.pop("id", None)
    # the request-wide count and bytes, b64_json images included
    check_media_refs(action_media_refs(checked), ctx.policy,
                     inline_images=action_inline_images(checked))
    fields = ctx.model.action_fields(checked)  # what the engine reads: limits check what runs
    ctx.model.check_generation_limits(fields, ctx.settings, video=True, action=True,
                                      multiple=ctx.multiple)
    ctx.model.plan_action(fields)  # the model's own checks, before the stage sees it
    return checked


def action_media(body: dict[str, Any]) -> list[str]:
    """The media the generation stage reads for the checked action ``body``: its references
    and its ``{"b64_json": ...}`` images (for the client media budget)."""
    return [ref for _, ref in action_media_refs(body)] + \
        [text for _, text in action_inline_images(body)]


def action_answer(ctx: DirectContext, result: StageResult, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to a finished action: native's envelope, or the raw output it holds."""
    response = result.payload.get("action")
    if not isinstance(response, dict):
        raise ServerError("the action generation returned no action")
    if response.get("object") == "action.generation":
        response = {**response, "model": ctx.served_name}
    if ctx.model.action_response_format(body) == "envelope":
        return response
    action = response["data"][0]["action"]
    raw = {"request_id": response.get("id"), "actions": action.get("values")}
    raw.update({k: action[k] for k in ("action_mode", "domain_id", "raw_action_dim")
                if k in action})
    raw["parameters"] = {"num_inference_steps": (response.get("usage") or {}).get(
        "denoise_steps")}
    return raw


def encode_answer(answer: dict[str, Any], msgpack: bool) -> bytes:
    """An answer as msgpack bytes (action values as native arrays)."""
    return pack_msgpack(with_native_arrays(answer) if msgpack else answer)


def add_action_routes(router: APIRouter, ctx: DirectContext) -> None:
    """The action generation and metadata routes."""

    @router.post("/v1/actions/generations",
                 openapi_extra=accepts(MULTIPART, MSGPACK, uploads=UPLOADS), responses=ERRORS)
    async def action_generations(request: Request, raw: ActionGenerationRequest) -> Response:
        """The native action route (JSON, a form or msgpack)."""
        body = raw.model_dump(exclude_unset=True)
        if request.state.body_format == MULTIPART:
            body = action_body_from_form(body, set(UPLOADS))
        body = check_action(ctx, body)
        await admit_media(action_media_refs(body), ctx.policy,
                          inline_images=action_inline_images(body))
        _, result = await ctx.call(request, {"modality": "action", "request": body},
                                   action_media(body))
        if result is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        answer = action_answer(ctx, result, body)
        if wants_msgpack(request):
            data = await asyncio.to_thread(encode_answer, answer, True)
            return Response(data, media_type=MSGPACK)
        return await json_response_off_loop(lambda: answer)

    @router.get("/v1/actions/metadata")
    async def metadata() -> Response:
        """What the action route takes and returns (native's metadata document)."""
        return json_response(metadata_of(ctx))


def metadata_of(ctx: DirectContext) -> dict[str, Any]:
    config = ctx.orchestrator.config
    return ctx.model.action_metadata(ctx.served_name, config.model_path, ctx.backend,
                                     dict(config.stage("generation").engine or {}))
