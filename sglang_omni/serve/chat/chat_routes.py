"""Text-only chat (``Cosmos3ReasonerPipelineConfig``): ``/v1/chat/completions`` answered by the
Reasoner alone; ``/generate`` is refused.

Admission (503) comes before the request id is used and before the stage loads any media; a
streaming answer commits to 200 only once the stage accepted the request. The admission ticket
and the rid are the request's state (``serve.request_states``), released when the request ends,
on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest, OmniError, ServiceUnavailable, is_client_error
from sglang_omni.media import check_chat_request
from sglang_omni.media.admission import admit_media
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.request_state import RequestState
from sglang_omni.serve.bodies.typed_route import omni_router
from sglang_omni.serve.chat.chat_request import parse_chat_fields, set_fields
from sglang_omni.serve.ops.mode_routes import ModeRoutes, check_model, refuse_generate
from sglang_omni.serve.ops.request_log import note_rid
from sglang_omni.serve.protocol.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.protocol.request_states import request_state
from sglang_omni.serve.schemas.chat import ChatCompletionRequest
from sglang_omni.serve.schemas.responses import MODEL_ERRORS, ChatCompletion
from sglang_omni.serve.wire.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.wire.openai_chat import chunk_body, completion_body
from sglang_omni.serve.wire.sse import ERROR_DATA, ends_with_done, sse_data, sse_response

STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"}}}


def chat_routes(orchestrator: Orchestrator, served_name: str) -> ModeRoutes:
    """The text-only chat route over ``orchestrator``'s Reasoner."""
    router = omni_router()
    stage_names = tuple(orchestrator.stages.handles)

    @router.post("/v1/chat/completions", responses={
        200: {"model": ChatCompletion, "content": STREAM_DOC}, **MODEL_ERRORS})
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """One Reasoner completion (streamed as chunks with ``stream: true``)."""
        fields = set_fields(body)  # one walk of the body, read by the parser and media check
        req = parse_chat_fields(fields, known_stages=stage_names)
        check_model(req.model, served_name)
        if req.include_progress:
            raise BadRequest("stream_options.include_progress: text-only chat runs no "
                             "generations, so it has no progress to send; leave it unset")
        refs = check_chat_request(fields, orchestrator.policy)
        await admit_media(refs, orchestrator.policy)
        orchestrator.check_healthy()
        return await _text_chat(request, orchestrator, req, req.model or served_name)

    refuse_generate(router, orchestrator.config.config_cls)
    return ModeRoutes(router)


async def _text_chat(request: Request, orchestrator: Orchestrator, req: ChatRequest,
                     model: str) -> Response:
    """One Reasoner completion. Admission (503) comes before the request id is used and before
    the stage loads any media; the ticket and the id are the request state's, released when
    the request ends (``serve.request_states``)."""
    state = request_state(request)
    orchestrator.admit_text_chat(state, req.messages)
    try:
        rid = orchestrator.claim(state, req.rid)
        note_rid(rid)
        if req.stream:
            return await _open_text_stream(request, orchestrator, state, model, req)
        result = await until_disconnect(request, _collect(orchestrator, state, req))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except OmniError as exc:
        if is_client_error(exc.status) or exc.status == ServiceUnavailable.status:
            state.refused = True  # the client may retry with the same rid
        raise
    body = completion_body(rid, model, result.payload.get("text", ""),
                           result.payload.get("finish_reason", "stop"),
                           result.payload.get("usage"))
    if result.payload.get("logprobs") is not None:
        body["choices"][0]["logprobs"] = result.payload["logprobs"]
    return JSONResponse(body)


async def _open_text_stream(request: Request, orchestrator: Orchestrator, state: RequestState,
                            model: str, req: ChatRequest) -> StreamingResponse:
    """Commit to 200 only once the stage accepted the request (its first chunk), so a refusal
    (invalid native field, refused or failed media) keeps its HTTP status."""
    assert state.rid is not None
    stream = state.closes(orchestrator.text_chat(state, req))
    first = await until_disconnect(request, anext(stream))
    response = sse_response(state.closes(_text_chat_sse(state.rid, model, req, first, stream)),
                            orchestrator.config.server.sse_keepalive_s)
    state.closes(response.body_iterator)
    return response


async def _collect(orchestrator: Orchestrator, state: RequestState, req: ChatRequest
                   ) -> StageResult:
    result: StageResult | None = None
    async for item in orchestrator.text_chat(state, req):
        if isinstance(item, StageResult):
            result = item
    assert result is not None
    return result


def _text_chat_sse(rid: str, model: str, req: ChatRequest, first: Any,
                   stream: AsyncGenerator[Any, None]) -> AsyncIterator[str]:
    return ends_with_done(_text_chunks(rid, model, req, first, stream), ERROR_DATA, rid)


async def _text_chunks(rid: str, model: str, req: ChatRequest, first: Any,
                       stream: AsyncGenerator[Any, None]) -> AsyncGenerator[str, None]:
    yield sse_data(chunk_body(rid, model, {"role": "assistant", "content": ""}))
    item = first
    while True:
        if isinstance(item, StageResult):
            usage = item.payload.get("usage") if req.include_usage else None
            yield sse_data(chunk_body(rid, model, {}, item.payload.get("finish_reason",
                                                                       "stop"), usage))
        elif item.get("text"):
            yield sse_data(chunk_body(rid, model, {"content": item["text"]}))
        try:
            item = await anext(stream)
        except StopAsyncIteration:
            break
