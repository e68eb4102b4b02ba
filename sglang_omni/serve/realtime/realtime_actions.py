"""``WS /v1/actions/realtime``: native's msgpack action protocol over one WebSocket.

The server accepts, then sends the action metadata (``GET /v1/actions/metadata``). Each
binary message from the client is one action request body (msgpack, as the HTTP route takes
it); the answer is the envelope of the HTTP route with native's float32 array maps for the
values and ``server_timing`` (``infer_ms``, and ``prev_total_ms`` from the second answer on).
Requests are answered one at a time, in order.

Each request takes an admission ticket of the direct routes as ``POST /v1/actions/generations``
does (``DirectGenerations.generate_alone``: a request state of its own, with its request id, for
its generation only; ``pipeline.admission.realtime``): an idle session holds none, and one
over ``server.max_direct_queue`` (or the queue's wait) is refused as the HTTP route refuses it.
A failure, a refused request included, is answered as native answers it: a message
``{"error": ...}`` (here the message text, with ``type`` and ``code``, 503 for a refusal:
never a traceback), then close code 1011. A client that leaves aborts the generation in
flight. Messages are bounded and checked as HTTP bodies are (:mod:`.ws_messages`); every body
passes the same checks as the HTTP route, media policy and generation limits included. The
requests a session holds (the one being answered and those sent ahead) count in the server's
body budget; one that does not fit is answered with the 503 error, then close 1011.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from fastapi import APIRouter, WebSocket

from sglang_omni.aio.race import race
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest, OmniError, ServerError, ShuttingDown
from sglang_omni.media.action_refs import action_inline_images, action_media_refs
from sglang_omni.media.admission import admit_media
from sglang_omni.serve.bodies.body_budget import BodyBudget, BodyLease
from sglang_omni.serve.bodies.msgpack_body import with_native_arrays
from sglang_omni.serve.direct.action_routes import (
    action_answer,
    action_media,
    check_action,
    metadata_of,
)
from sglang_omni.serve.direct.context import DirectContext
from sglang_omni.serve.realtime.ws_messages import WS_INTERNAL_ERROR, close, decode, receive, send
from sglang_omni.serve.wire.http_errors import GENERIC_500

log = logging.getLogger("sglang_omni.serve")


#: Requests a client may send ahead while one runs (then the server stops reading until one is
#: answered).
MAX_WAITING = 4


class _Left(Exception):
    """The client closed the connection."""


class _Held:
    """The messages a connection holds (the one being answered and those waiting in ``inbox``)
    under a lease on the server's body budget: 503 when they do not fit beside the other
    request bodies being read (``server.max_pending_body_bytes``)."""

    def __init__(self, budget: BodyBudget | None) -> None:
        self.inbox: deque[bytes] = deque()
        self.current = 0
        self.lease: BodyLease | None = budget.lease() if budget is not None else None

    def account(self) -> None:
        if self.lease is not None:
            self.lease.resize(self.current + sum(len(m) for m in self.inbox))

    def close(self) -> None:
        self.inbox.clear()
        if self.lease is not None:
            self.lease.close()


async def _run(ctx: DirectContext, websocket: WebSocket, body: dict[str, Any],
               held: _Held) -> StageResult:
    """One action generation, reading on meanwhile: a client that leaves aborts it; messages
    that arrive meanwhile wait in ``held.inbox`` (at most :data:`MAX_WAITING`, then reading
    pauses)."""
    finish = await race(ctx.door.generate_alone({"modality": "action", "request": body},
                                                action_media(body)),
                        _hold_messages(websocket, held))
    if finish.index == 1:
        raise _Left()
    result: StageResult = finish.value[1]
    return result


async def _hold_messages(websocket: WebSocket, held: _Held) -> None:
    """Read the messages that arrive while an action runs into ``held.inbox`` (at most
    :data:`MAX_WAITING`, then reading pauses); returns when the client left."""
    while len(held.inbox) < MAX_WAITING:
        message = await receive(websocket)
        if message is None:
            return
        held.inbox.append(message)
        held.account()
    await asyncio.Event().wait()  # reading paused until the action ends


async def _answer(ctx: DirectContext, websocket: WebSocket, message: bytes,
                  held: _Held, prev_total_s: float | None) -> dict[str, Any]:
    body = decode(websocket, message)
    if not isinstance(body, dict):
        raise BadRequest("each message is one action request: a msgpack map")
    body = check_action(ctx, body)
    await admit_media(action_media_refs(body), ctx.policy,
                      inline_images=action_inline_images(body))
    infer_started = time.monotonic()
    result = await _run(ctx, websocket, body, held)
    answer = dict(with_native_arrays(action_answer(ctx, result, body)))
    timing = {"infer_ms": (time.monotonic() - infer_started) * 1000}
    if prev_total_s is not None:
        timing["prev_total_ms"] = prev_total_s * 1000
    answer["server_timing"] = {**(answer.get("server_timing") or {}), **timing}
    return answer


async def serve_realtime_actions(websocket: WebSocket, ctx: DirectContext) -> None:
    """Run one realtime action connection (see the module docstring)."""
    await websocket.accept()
    try:
        async with ctx.door.sessions.session():
            await _serve(websocket, ctx)
    except ShuttingDown as exc:
        await _fail(websocket, exc)


async def _serve(websocket: WebSocket, ctx: DirectContext) -> None:
    """The admitted session's messages, one at a time."""
    budget = getattr(websocket.app.state, "body_budget", None)
    held = _Held(budget if isinstance(budget, BodyBudget) else None)
    try:
        if not await send(websocket, metadata_of(ctx)):
            return
        prev_total_s: float | None = None
        while True:
            try:
                message = held.inbox.popleft() if held.inbox else await receive(websocket)
                if message is None:
                    return
                held.current = len(message)
                held.account()
                started = time.monotonic()
                answer = await _answer(ctx, websocket, message, held, prev_total_s)
                held.current = 0
                held.account()
            except _Left:
                log.info("realtime actions: the client left; its generation was aborted")
                return
            except OmniError as exc:
                await _fail(websocket, exc)
                return
            except Exception:  # noqa: BLE001 - a bug ends this connection, not the server
                log.exception("realtime actions: unexpected failure")
                await _fail(websocket, ServerError(GENERIC_500))
                return
            if not await send(websocket, answer):
                return
            prev_total_s = time.monotonic() - started
    finally:
        held.close()


async def _fail(websocket: WebSocket, exc: OmniError) -> None:
    """Native's failure: an ``error`` message, then close 1011."""
    await send(websocket, {"error": exc.message, "type": exc.type, "code": exc.status})
    await close(websocket, WS_INTERNAL_ERROR, exc.message)


def add_realtime_action_route(router: APIRouter, ctx: DirectContext) -> None:
    @router.websocket("/v1/actions/realtime")
    async def realtime_actions(websocket: WebSocket) -> None:
        """msgpack action requests over one WebSocket (see ``serve.realtime_actions``)."""
        await serve_realtime_actions(websocket, ctx)
