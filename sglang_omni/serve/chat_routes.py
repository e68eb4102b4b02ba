"""Text-only chat (``Cosmos3ReasonerPipelineConfig``): ``/v1/chat/completions`` answered by the
Reasoner alone; ``/generate`` is refused.

Admission (503) comes before the request id is used and before the stage loads any media; a
streaming answer commits to 200 only once the stage accepted the request, and the admission
ticket and the rid are released when the request ends, on the event loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest, OmniError, ServiceUnavailable, is_client_error
from sglang_omni.media import check_chat_request
from sglang_omni.media.admission import admit_media
from sglang_omni.pipeline.chat_admission import AdmissionTicket
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.runtime.request_ids import RequestIds
from sglang_omni.serve.chat_request import parse_chat_request, set_fields
from sglang_omni.serve.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.mode_routes import ModeRoutes, check_model, refuse_generate
from sglang_omni.serve.openai_chat import chunk_body, completion_body
from sglang_omni.serve.request_log import note_rid
from sglang_omni.serve.schemas.chat import ChatCompletionRequest
from sglang_omni.serve.schemas.responses import MODEL_ERRORS, ChatCompletion
from sglang_omni.serve.sse import ERROR_DATA, ends_with_done, sse_data, sse_response
from sglang_omni.serve.typed_route import omni_router

STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"}}}


def chat_routes(orchestrator: Orchestrator, served_name: str) -> ModeRoutes:
    """The text-only chat route over ``orchestrator``'s Reasoner."""
    router = omni_router()
    stage_names = tuple(orchestrator.stages.handles)

    @router.post("/v1/chat/completions", responses={
        200: {"model": ChatCompletion, "content": STREAM_DOC}, **MODEL_ERRORS})
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """One Reasoner completion (streamed as chunks with ``stream: true``)."""
        req = parse_chat_request(body, known_stages=stage_names)
        check_model(req.model, served_name)
        if req.include_progress:
            raise BadRequest("stream_options.include_progress: text-only chat runs no "
                             "generations, so it has no progress to send; leave it unset")
        refs = check_chat_request(set_fields(body), orchestrator.policy)
        await admit_media(refs, orchestrator.policy)
        orchestrator.check_healthy()
        return await _text_chat(request, orchestrator, req, req.model or served_name)

    refuse_generate(router, orchestrator.config.config_cls)
    return ModeRoutes(router)


async def _text_chat(request: Request, orchestrator: Orchestrator, req: ChatRequest,
                     model: str) -> Response:
    """One Reasoner completion. Admission (503) comes before the request id is used and before
    the stage loads any media; the ticket is released when the request ends."""
    ticket = orchestrator.admit_text_chat()
    handed_over = False
    rid: str | None = None
    try:
        rid = orchestrator.ids.claim(req.rid)
        note_rid(rid)
        if req.stream:
            response = await _open_text_stream(request, orchestrator, rid, model, req, ticket)
            handed_over = True
            return response
        result = await until_disconnect(request, _collect(orchestrator, rid, req))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except OmniError as exc:
        if rid is not None and (is_client_error(exc.status)
                                or exc.status == ServiceUnavailable.status):
            orchestrator.ids.forget(rid)  # refused: the client may retry with the same rid
        raise
    finally:
        if not handed_over:
            _release(ticket)
            if rid is not None:
                orchestrator.ids.finish(rid)
    body = completion_body(rid, model, result.payload.get("text", ""),
                           result.payload.get("finish_reason", "stop"),
                           result.payload.get("usage"))
    if result.payload.get("logprobs") is not None:
        body["choices"][0]["logprobs"] = result.payload["logprobs"]
    return JSONResponse(body)


async def _open_text_stream(request: Request, orchestrator: Orchestrator, rid: str, model: str,
                            req: ChatRequest, ticket: AdmissionTicket | None
                            ) -> StreamingResponse:
    """Commit to 200 only once the stage accepted the request (its first chunk), so a refusal
    (invalid native field, refused or failed media) keeps its HTTP status."""
    stream = orchestrator.text_chat(rid, req)
    try:
        first = await until_disconnect(request, anext(stream))
    except BaseException:
        await stream.aclose()
        raise
    sse = _text_chat_sse(rid, model, req, first, stream, ticket, orchestrator.ids)
    loop = asyncio.get_running_loop()

    async def end() -> None:  # after the response, or the client gone; on the event loop
        _release(ticket)
        orchestrator.ids.finish(rid)

    # A response that never starts still ends the request: the garbage collector may run the
    # finalizer in any thread, so it hands the work to the event loop.
    weakref.finalize(sse, _on_loop, loop, _release, ticket)
    weakref.finalize(sse, _on_loop, loop, orchestrator.ids.finish, rid)
    return sse_response(sse, orchestrator.config.server.sse_keepalive_s,
                        background=BackgroundTask(end))


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop``'s thread (now if this is it); dropped if it is closed."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
        return
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the server is gone, and its state with it
        pass


def _release(ticket: AdmissionTicket | None) -> None:
    if ticket is not None:
        ticket.release()


async def _collect(orchestrator: Orchestrator, rid: str, req: ChatRequest) -> StageResult:
    result: StageResult | None = None
    async for item in orchestrator.text_chat(rid, req):
        if isinstance(item, StageResult):
            result = item
    assert result is not None
    return result


def _text_chat_sse(rid: str, model: str, req: ChatRequest, first: Any,
                   stream: AsyncGenerator[Any, None], ticket: AdmissionTicket | None,
                   ids: RequestIds | None = None) -> AsyncIterator[str]:
    return ends_with_done(_text_chunks(rid, model, req, first, stream, ticket, ids), ERROR_DATA,
                          rid)


async def _text_chunks(rid: str, model: str, req: ChatRequest, first: Any,
                       stream: AsyncGenerator[Any, None], ticket: AdmissionTicket | None,
                       ids: RequestIds | None) -> AsyncGenerator[str, None]:
    async def items() -> AsyncIterator[Any]:
        yield first
        async for item in stream:
            yield item

    try:
        yield sse_data(chunk_body(rid, model, {"role": "assistant", "content": ""}))
        async for item in items():
            if isinstance(item, StageResult):
                usage = item.payload.get("usage") if req.include_usage else None
                yield sse_data(chunk_body(rid, model, {}, item.payload.get("finish_reason",
                                                                           "stop"), usage))
            elif item.get("text"):
                yield sse_data(chunk_body(rid, model, {"content": item["text"]}))
    finally:
        await stream.aclose()
        _release(ticket)
        if ids is not None:
            ids.finish(rid)
