"""The native image routes of direct generation.

* ``POST /v1/images/generations`` (JSON): one PNG, as ``b64_json`` (the default) or as a
  ``url`` that ``GET /v1/images/{id}/content`` serves from memory (:mod:`.image_store`).
* ``POST /v1/images/edits`` (a form, as native, or JSON): ``image``/``image[]`` uploads and/or
  ``url``/``url[]`` references (in JSON, lists of media references), every one judged by the
  media policy with the chat media limits before any work. Cosmos3 conditions a generation on
  one image, so more than one is refused, as is a ``mask`` (native ignores it). A single-frame
  Cosmos3 generation is text-to-image (diffusers' pipeline ignores the conditioning image of
  one frame): use ``/v1/videos`` with ``input_reference`` to follow an image.
* ``GET /v1/images/{id}/content``: the PNG of a ``url`` answer while it is held.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from sglang_omni.errors import BadRequest
from sglang_omni.media.admission import admit_media
from sglang_omni.media.refs import check_media_refs
from sglang_omni.serve.bodies.body_formats import accepts
from sglang_omni.serve.bodies.multipart_body import MULTIPART
from sglang_omni.serve.direct.context import DirectContext, single_media
from sglang_omni.serve.direct.fields import (
    EDIT_FIELDS,
    IMAGE_FIELDS,
    check_image_format,
    flatten,
    split,
)
from sglang_omni.serve.schemas.direct import (
    IMAGE_OPTIONS,
    ImageEditRequest,
    ImageGenerationRequest,
)
from sglang_omni.serve.schemas.responses import ERRORS, ImageGenerationResponse
from sglang_omni.serve.wire.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.wire.responses import json_response, json_response_off_loop

EDIT_UPLOADS = ("image", "image[]", "mask")


async def generate_image(request: Request, ctx: DirectContext, fields: dict[str, Any],
                         options: dict[str, Any], media: tuple[str, ...] = ()) -> Response:
    """Run one image generation and answer in the requested format; ``media``: the
    references the stage reads for it (held in the client media budget while it runs)."""
    response_format = check_image_format(fields)
    ctx.model.check_generation_limits(options, ctx.settings, video=False, backend=ctx.backend,
                                      multiple=ctx.multiple)
    rid, result = await ctx.call(request, {"modality": "image", "prompt": fields["prompt"],
                                            "options": options}, media)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    data = single_media("image", result)
    head = {"id": rid, "created": int(time.time())}
    if response_format == "url":
        stored = ctx.images.put(rid, data)
        return json_response({**head, "data": [{"url": stored.url,
                                                "revised_prompt": fields["prompt"]}],
                              "inference_time_s": result.engine_s})
    return await json_response_off_loop(lambda: {  # base64 of the image: off the loop
        **head, "data": [{"b64_json": base64.b64encode(data).decode(),
                          "revised_prompt": fields["prompt"]}],
        "inference_time_s": result.engine_s})


def edit_image_ref(ctx: DirectContext, fields: dict[str, Any]) -> tuple[str, str]:
    """``(label, reference)`` of the one conditioning image of an edit, checked under the
    media policy."""
    if fields.get("mask") is not None:
        raise BadRequest("mask: Cosmos3 does not take an edit mask; remove it")
    if fields.get("num_frames") not in (None, 1):
        raise BadRequest("num_frames: an edit returns one image; leave it at 1 (use /v1/videos "
                         "with input_reference for a video)")
    refs = []
    for key in ("image", "url"):
        given = fields.get(key)
        items = given if isinstance(given, list) else [] if given is None else [given]
        refs += [(f"{key}[{i}]", ref) for i, ref in enumerate(items)]
    for label, ref in refs:
        if not isinstance(ref, str):
            raise BadRequest(f"{label}: expected an uploaded image or a URL string")
    if not refs:
        raise BadRequest("image: required: upload the image to edit as 'image' (or 'image[]'), "
                         "or give its URL as 'url'")
    if len(refs) > 1:
        raise BadRequest(f"{refs[1][0]}: Cosmos3 conditions a generation on one image; send "
                         "one")
    check_media_refs(refs, ctx.policy)
    return refs[0]


def add_image_routes(router: APIRouter, ctx: DirectContext) -> None:
    """The image generation, edit and content routes."""

    @router.post("/v1/images/generations",
                 responses={200: {"model": ImageGenerationResponse}, **ERRORS})
    async def image_generations(request: Request, body: ImageGenerationRequest) -> Response:
        """Generate one image (PNG), returned as ``b64_json`` or as a ``url``."""
        fields, options = split(flatten(body, ctx.settings), IMAGE_FIELDS, IMAGE_OPTIONS,
                                "/v1/images/generations")
        return await generate_image(request, ctx, fields, options)

    @router.post("/v1/images/edits", openapi_extra=accepts(MULTIPART, uploads=EDIT_UPLOADS),
                 responses={200: {"model": ImageGenerationResponse}, **ERRORS})
    async def image_edits(request: Request, body: ImageEditRequest) -> Response:
        """Generate one image conditioned on an uploaded or referenced image (a form; JSON
        with ``image``/``url`` as lists of media references works too)."""
        fields, options = split(flatten(body, ctx.settings), EDIT_FIELDS, IMAGE_OPTIONS,
                                "/v1/images/edits")
        label, options["image_path"] = edit_image_ref(ctx, fields)
        await admit_media([(label, options["image_path"])], ctx.policy)
        return await generate_image(request, ctx, fields, options, (options["image_path"],))

    @router.get("/v1/images/{image_id}/content",
                responses={200: {"content": {"image/png": {}}, "description": "the PNG"}})
    async def image_content(image_id: str, variant: str | None = Query(None)) -> Response:
        """The image of a ``url`` answer, while it is held."""
        image = ctx.images.get(image_id, variant)
        return Response(image.data, media_type=image.media_type, headers={
            "Content-Disposition": f'attachment; filename="{image_id}.png"'})
