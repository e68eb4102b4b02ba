"""``WS /v1/realtime_video/generate``: native's realtime video protocol, for Cosmos3.

Messages are binary msgpack maps both ways (:mod:`.ws_messages` bounds and checks them).

1. The client sends ``{"type": "init", "prompt", ...}`` (:class:`~.schemas.realtime.
   RealtimeVideoInit`). A message that is not a valid init is answered
   ``{"type": "error", "content": "invalid generate request", "error": {message, type,
   code}}`` and the server waits for another, as native does (``error`` says what to change).
   The init must come within ``server.body_timeout_s``; every media reference and the
   ``first_frame`` bytes pass the media policy, and the chunk the generation limits, first.
2. The server then generates chunk after chunk, each one video generation sent as
   ``{"type": "frame_batch", "request_id", "chunk_index", "content_type": "video/mp4",
   "num_frames", "total_size", "frame_batch_index": 0, "num_frame_batches": 1,
   "is_final_frame_batch": true, "payload": <MP4 bytes>}``. Cosmos3 is not a causal video
   model: each chunk after the first is conditioned on the last frame of the one before.
   Each chunk takes an admission ticket of the direct routes, as an image or action request
   does (``DirectGenerations.generate_alone``: a request state of its own, whose request id
   is the chunk's ``request_id``), for that chunk only: requests on the HTTP routes take
   their turns between a session's chunks, and a refused chunk (``server.max_direct_queue``)
   ends the session as a failed one does.
3. Meanwhile the client may send ``{"type": "event", "kind": "prompt", "payload": "..."}``:
   the chunks after it follow the new prompt. Another message is answered
   ``{"type": "error", "content": "invalid event", ...}``.
4. After ``max_chunks`` chunks the server closes with 1000. ``max_chunks`` is at most
   ``server.max_realtime_chunks``, and that is its default too, so no session runs for ever
   (more is refused as an invalid init, naming the field and the maximum). A failed
   generation is answered ``{"type": "error", "content": "error during generate loop: ..."}``
   and the session ends (close 1000, as native's handler returns). A client that leaves
   aborts the chunk in flight.

One session runs at a time (the generation stage serves one generation at a time): a second is
answered ``{"type": "error", "content": "another realtime session is already active"}`` and
closed with 1008, as native does, unless the first ends within ``SLOT_WAIT_S`` (a session
whose client left keeps the slot until the stage has ended its aborted chunk, so a client that
reconnects at once waits for that instead of being refused). These session rules are
``pipeline.admission.realtime``'s.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket

from sglang_omni.aio.race import race
from sglang_omni.contract.generation_options import ACTION_OPTION_DEFAULTS, DEFAULT_VIDEO_FRAMES
from sglang_omni.errors import BadRequest, OmniError, ServerError, ShuttingDown
from sglang_omni.media.admission import admit_media
from sglang_omni.media.decode import decode_mp4_frames
from sglang_omni.media.encode import encode_png
from sglang_omni.media.refs import iter_generation_media_refs
from sglang_omni.pipeline.admission.realtime import SessionSlotTaken, session_chunks
from sglang_omni.serve.direct.context import DirectContext, single_media
from sglang_omni.serve.direct.fields import VIDEO_FIELDS, flatten, split
from sglang_omni.serve.direct.video_routes import VideoPlan, plan_video
from sglang_omni.serve.realtime.ws_messages import (
    WS_NORMAL,
    WS_POLICY_VIOLATION,
    WS_TRY_AGAIN_LATER,
    close,
    decode,
    error_body,
    receive,
    send,
    settings_of,
)
from sglang_omni.serve.schemas.direct import VIDEO_OPTIONS
from sglang_omni.serve.schemas.realtime import RealtimeEvent, RealtimeVideoInit
from sglang_omni.serve.wire.http_errors import GENERIC_500
from sglang_omni.serve.wire.validation import validate

log = logging.getLogger("sglang_omni.serve")
ROUTE = "/v1/realtime_video/generate"
#: Native's realtime defaults (``RealtimeVideoGenerationsRequest``) where the init leaves them.
REALTIME_DEFAULTS = {k: ACTION_OPTION_DEFAULTS[k] for k in ("seed", "guidance_scale")}
REALTIME_SIZE = f"{ACTION_OPTION_DEFAULTS['width']}x{ACTION_OPTION_DEFAULTS['height']}"
_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
          (b"RIFF", "image/webp"))


@dataclass
class Session:
    """A running session: its plan, the prompt the next chunk follows, and the last event."""

    plan: VideoPlan
    prompt: str
    max_chunks: int
    event_id: int | None = None


def image_data_url(data: bytes) -> str:
    mime = next((m for magic, m in _MAGIC if data.startswith(magic)),
                "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def last_frame_png(mp4: bytes) -> bytes:
    return encode_png(decode_mp4_frames(mp4)[-1])


def start_session(ctx: DirectContext, value: Any) -> Session:
    """The session an init message asks for; 400 (naming the field) otherwise."""
    if not isinstance(value, dict):
        raise BadRequest("the generate request must be a msgpack map")
    if value.get("type") != "init":
        raise BadRequest('type: the first message is the generate request, {"type": "init", '
                         '"prompt": ...}')
    body = flatten(validate(RealtimeVideoInit, value), ctx.settings)
    body.pop("type")
    first_frame = body.pop("first_frame", None)
    max_chunks = session_chunks(body.pop("max_chunks", None), ctx.settings.max_realtime_chunks)
    if body.pop("condition_inputs", None) is not None:
        raise BadRequest("condition_inputs: Cosmos3 takes no realtime conditions; steer the "
                         "session with prompt events")
    if first_frame is not None:
        if "input_reference" in body:
            raise BadRequest("first_frame: give the first frame or input_reference, not both")
        body["input_reference"] = image_data_url(first_frame) \
            if isinstance(first_frame, bytes) else first_frame
    for key, default in REALTIME_DEFAULTS.items():
        body.setdefault(key, default)
    if not {"size", "width", "height"} & set(body):
        body["size"] = REALTIME_SIZE
    if "num_frames" not in body and "seconds" not in body:
        body["num_frames"] = DEFAULT_VIDEO_FRAMES
    fields, options = split(body, VIDEO_FIELDS, VIDEO_OPTIONS, ROUTE)
    plan = plan_video(ctx, fields, options)
    if first_frame is not None:  # refusals name the field the client sent
        plan = dataclasses.replace(plan, media=tuple(
            ("first_frame" if label == "input_reference" else label, ref)
            for label, ref in plan.media))
    return Session(plan, plan.prompt, max_chunks)


async def _init(ctx: DirectContext, websocket: WebSocket) -> Session | None:
    """Wait for a valid init (None when the client left or took too long)."""
    timeout = settings_of(websocket).body_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive(websocket)
        except TimeoutError:
            await _error(websocket, "invalid generate request", BadRequest(
                f"no generate request within {timeout:g} s (server.body_timeout_s)"))
            await close(websocket, WS_POLICY_VIOLATION, "no generate request in time")
            return None
        except BadRequest as exc:  # a text frame
            await _error(websocket, "invalid generate request", exc)
            continue
        if message is None:
            return None
        try:
            session = start_session(ctx, decode(websocket, message, binary_ok={"first_frame"}))
            await admit_media(session.plan.media, ctx.policy)
            return session
        except OmniError as exc:
            await _error(websocket, "invalid generate request", exc)


async def _error(websocket: WebSocket, content: str, exc: OmniError) -> bool:
    return await send(websocket, {"type": "error", "content": content,
                                  "error": error_body(exc)})


async def _generate(ctx: DirectContext, websocket: WebSocket, session: Session) -> None:
    """Chunk after chunk until ``max_chunks`` (or the client leaves: the task is cancelled),
    each under its own admission ticket."""
    options = dict(session.plan.options)
    for index in range(session.max_chunks):
        rid, result = await ctx.door.generate_alone(
            {"modality": "video", "prompt": session.prompt, "options": dict(options)},
            [ref for _, ref in iter_generation_media_refs(options)])
        data = single_media("video", result)
        message = {"type": "frame_batch", "request_id": rid, "chunk_index": index,
                   "content_type": "video/mp4", "num_frames": options["num_frames"],
                   "total_size": len(data), "frame_batch_index": 0, "num_frame_batches": 1,
                   "is_final_frame_batch": True, "payload": data}
        if session.event_id is not None:
            message["event_id"] = session.event_id
        if not await send(websocket, message):
            return
        last = await asyncio.to_thread(last_frame_png, data)
        options.pop("video_path", None)
        options["image_path"] = image_data_url(last)


async def _listen(websocket: WebSocket, session: Session) -> None:
    """Apply events until the client leaves."""
    while True:
        try:
            message = await receive(websocket)
            if message is None:
                return
            event = validate(RealtimeEvent, decode(websocket, message))
            if not isinstance(event.payload, str) or not event.payload.strip():
                raise BadRequest("payload: the new prompt, a non-empty string")
        except OmniError as exc:
            await _error(websocket, "invalid event", exc)
            continue
        session.prompt = event.payload
        session.event_id = event.event_id if isinstance(event.event_id, int) else None


async def _run(ctx: DirectContext, websocket: WebSocket) -> None:
    session = await _init(ctx, websocket)
    if session is None:
        return
    try:
        finish = await race(_generate(ctx, websocket, session), _listen(websocket, session))
    except OmniError as exc:
        await _error(websocket, f"error during generate loop: {exc.message}", exc)
    except Exception as exc:  # noqa: BLE001 - the session ends with an error message
        log.error("realtime video: unexpected failure", exc_info=exc)
        error = ServerError(GENERIC_500)
        await _error(websocket, f"error during generate loop: {error.message}", error)
    else:
        if finish.index == 1:
            log.info("realtime video: the client left; its generation was aborted")
            return
    await close(websocket, WS_NORMAL, "session ended")


def add_realtime_video_route(router: APIRouter, ctx: DirectContext) -> None:
    @router.websocket(ROUTE)
    async def realtime_video(websocket: WebSocket) -> None:
        """A realtime video session (see ``serve.realtime_video``)."""
        await websocket.accept()
        try:
            async with ctx.door.sessions.video_session():
                await _run(ctx, websocket)
        except SessionSlotTaken:
            await send(websocket, {"type": "error",
                                   "content": "another realtime session is already active"})
            await close(websocket, WS_POLICY_VIOLATION, "another realtime session is active")
        except ShuttingDown:
            await send(websocket, {"type": "error", "content": ShuttingDown().message})
            await close(websocket, WS_TRY_AGAIN_LATER, "the server is shutting down")
