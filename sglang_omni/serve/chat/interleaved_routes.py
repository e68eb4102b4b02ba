"""The interleaved pipeline (``Cosmos3UMMPipelineConfig``): ``/v1/chat/completions`` and
``/generate``, each streaming (SSE) or not.

A request is checked (400), admitted by the deadline plan (503) and only then run. Its rid,
run, plan, progress and media are its request state's (``serve.request_states``), released when
its response ends or its client leaves, on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sglang_omni.contract.model import served_model
from sglang_omni.errors import BadRequest
from sglang_omni.media import check_chat_request
from sglang_omni.media.admission import admit_media
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.progress import Progress, with_progress
from sglang_omni.pipeline.request_state import RequestState
from sglang_omni.pipeline.umm import Complete, Segment, UMMRun, history_bytes
from sglang_omni.serve.bodies.request_body import parsed_on_loop
from sglang_omni.serve.bodies.typed_route import omni_router
from sglang_omni.serve.chat.chat_request import parse_chat_fields, set_fields
from sglang_omni.serve.chat.fleet_queue import waited_s
from sglang_omni.serve.chat.generate_request import parse_generate_fields
from sglang_omni.serve.ops.mode_routes import ModeRoutes, check_model
from sglang_omni.serve.ops.request_log import note_rid, note_run
from sglang_omni.serve.protocol.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.protocol.request_states import request_state
from sglang_omni.serve.schemas.chat import ChatCompletionRequest, GenerateRequest
from sglang_omni.serve.schemas.responses import (
    MODEL_ERRORS,
    ChatCompletion,
    GenerateResponse,
    Queue,
)
from sglang_omni.serve.wire.http_errors import CLIENT_CLOSED_REQUEST
from sglang_omni.serve.wire.responses import json_response, json_response_off_loop
from sglang_omni.serve.wire.sse import sse_response
from sglang_omni.serve.wire.umm_wire import (
    chat_json,
    chat_sse,
    collect,
    generate_json,
    generate_sse,
)

Events = AsyncIterator[Segment | Complete] | AsyncIterator[Segment | Complete | Progress]
STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"}}}


def interleaved_routes(orchestrator: Orchestrator, served_name: str) -> ModeRoutes:
    """The interleaved routes over ``orchestrator``."""
    router = omni_router()
    config = orchestrator.config
    stage_names = tuple(orchestrator.stages.handles)
    generation = config.stages.get("generation")
    model = served_model(config)
    backend = generation.factory.get("backend") if generation else None
    multiple = model.size_multiple(backend)

    async def open_run(request: Request, state: RequestState, req: ChatRequest) -> UMMRun:
        """Check the generation limits, measure the history (off the event loop for a large
        body), open the run of the claimed ``state`` (400/503 before any model work; the
        deadline counts from the request's arrival at a fleet gateway, when one forwarded it).
        Refused, its rid is free again."""
        assert state.rid is not None
        try:
            model.check_generation_limits(req.stage_params.get("generation") or {},
                                          config.server, where="stage_params.generation.",
                                          feeds_reasoner=True, backend=backend,
                                          multiple=multiple)
            history_size = history_bytes(req.messages) if parsed_on_loop(request) else \
                await asyncio.to_thread(history_bytes, req.messages)
            run = orchestrator.open_interleaved(state, req.admitted(  # the UMMRequest
                state.rid, media_policy=orchestrator.policy, history_size=history_size,
                waited_s=waited_s(request.scope)))
        except BaseException:
            state.refused = True
            raise
        note_run(run)
        return run

    async def respond(request: Request, state: RequestState, run: UMMRun,
                      stream_form: Callable[[Events], AsyncIterator[str]] | None,
                      json_form: Callable[[Complete], Any], progress: bool = False) -> Response:
        """Drive ``run``; every iterator read is the state's, closed when it is released."""
        events: AsyncIterator[Any] = state.closes(run.events())
        if progress:  # subscribed before the first dispatch runs, so no event is missed
            assert state.progress is not None
            events = state.closes(with_progress(events, state.progress.subscribe()))
        if stream_form is not None:
            response = sse_response(state.closes(stream_form(events)),
                                    config.server.sse_keepalive_s)
            state.closes(response.body_iterator)
            return response
        try:
            done = await until_disconnect(request, collect(events))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        # base64 and JSON of up to 17 media segments: off the event loop (text alone: on it)
        return await json_response_off_loop(lambda: json_form(done),
                                            content_bytes=done.content_bytes)

    @router.post("/v1/chat/completions", responses={
        200: {"model": ChatCompletion, "content": STREAM_DOC}, **MODEL_ERRORS})
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """An interleaved request in the OpenAI chat shape: every segment in order (streamed
        as ``delta.segment`` chunks with ``stream: true``)."""
        fields = set_fields(body)  # one walk of the body, read by the parser and media check
        req = parse_chat_fields(fields, known_stages=stage_names)
        check_model(req.model, served_name)
        refs = check_chat_request(fields, orchestrator.policy)
        await admit_media(refs, orchestrator.policy)
        orchestrator.check_healthy()
        model = req.model or served_name
        if req.extra.get("logprobs") or req.extra.get("return_logprob"):
            raise BadRequest("logprobs: interleaved results carry no logprobs; leave it unset")
        state = request_state(request)
        rid = orchestrator.claim(state, req.rid)
        note_rid(rid)
        run = await open_run(request, state, req)
        stream_form = (lambda ev: chat_sse(rid, model, req.include_usage, ev)) \
            if req.stream else None
        return await respond(request, state, run, stream_form,
                             lambda done: chat_json(rid, model, done), req.include_progress)

    @router.post("/generate", responses={
        200: {"model": GenerateResponse, "content": STREAM_DOC}, **MODEL_ERRORS})
    async def generate(request: Request, body: GenerateRequest) -> Response:
        """An interleaved request: ``event: segment`` per segment, then ``event: complete``
        (or one JSON body with ``stream: false``)."""
        fields = set_fields(body)  # one walk of the body, read by the parser and media check
        req = parse_generate_fields(fields, stage_names)
        check_model(req.model, served_name)
        await admit_media(check_chat_request(fields, orchestrator.policy),
                          orchestrator.policy)
        orchestrator.check_healthy()
        state = request_state(request)
        rid = orchestrator.claim(state, req.rid)
        note_rid(rid)
        run = await open_run(request, state, req)
        return await respond(request, state, run,
                             (lambda ev: generate_sse(ev, rid)) if req.stream else None,
                             lambda done: generate_json(rid, done), req.include_progress)

    @router.get("/v1/queue", responses={200: {"model": Queue}})
    async def queue() -> Response:
        """The admission and deadline plan: every running request's phase, allowance and
        planned finish, in generation-stage order, and the planner's measured times."""
        return json_response({"active": orchestrator.admitted,
                              "max_active": orchestrator.max_active,
                              **orchestrator.media_budget.report(),
                              **orchestrator.scheduler.report()})

    return ModeRoutes(router)
