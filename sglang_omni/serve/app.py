"""The FastAPI application: lifespan owns the orchestrator; routes translate the wire."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest, OmniError, ServiceUnavailable, is_client_error
from sglang_omni.media import check_chat_request
from sglang_omni.models.cosmos3.generation_limits import check_generation_limits, size_multiple
from sglang_omni.pipeline.chat_admission import AdmissionTicket
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.umm import UMMRequest, UMMRun, history_bytes
from sglang_omni.runtime.request_ids import RequestIds
from sglang_omni.runtime.stage_result import StageResult
from sglang_omni.serve.auth import ApiKeyAuth
from sglang_omni.serve.chat_request import parse_chat_request
from sglang_omni.serve.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.generate_request import parse_generate_request
from sglang_omni.serve.generation_routes import generation_routes
from sglang_omni.serve.http_errors import CLIENT_CLOSED_REQUEST, install_error_handlers
from sglang_omni.serve.metrics import build_registry
from sglang_omni.serve.openai_chat import chunk_body, completion_body
from sglang_omni.serve.request_body import read_json_body
from sglang_omni.serve.responses import json_response, json_response_off_loop
from sglang_omni.serve.sse import SSE_DONE, sse_data, sse_response, stream_error
from sglang_omni.serve.umm_wire import chat_json, chat_sse, collect, generate_json, generate_sse

log = logging.getLogger("sglang_omni.serve")


def error_response(exc: OmniError,
                   retry_after_s: int = ServerSettings.retry_after_s) -> Response:
    """The JSON error answer. A 503 (every ServiceUnavailable) carries ``Retry-After``; the
    body is ASCII JSON, so no message text can fail to encode."""
    unavailable = isinstance(exc, ServiceUnavailable) or exc.status == ServiceUnavailable.status
    headers = {"Retry-After": str(retry_after_s)} if unavailable else None
    return json_response(exc.to_body(), exc.status, headers)


def create_app(config: ResolvedConfig, model_name: str | None = None,
               log_level: str = "info") -> FastAPI:
    """Build the app; stages start in the lifespan, so a failed stage fails server startup."""
    orchestrator = Orchestrator(config, log_level)
    served_name = model_name or config.model_path or config.config_cls

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await orchestrator.start()
        try:
            yield
        finally:
            await orchestrator.stop()

    app = FastAPI(title="SGLang Omni", lifespan=lifespan)
    app.state.orchestrator = orchestrator
    app.state.server_settings = config.server
    if config.server.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=config.server.api_key)
    install_error_handlers(app, error_response)  # outermost: JSON 500s, 401s included
    registry = build_registry(orchestrator)

    @app.exception_handler(OmniError)
    async def _omni_error(_: Request, exc: OmniError) -> Response:
        return error_response(exc, config.server.retry_after_s)

    @app.get("/health")
    async def health() -> Response:
        report = orchestrator.health()
        ok = report["status"] == "ok"
        headers = None if ok else {"Retry-After": str(config.server.retry_after_s)}
        return JSONResponse(report, status_code=200 if ok else ServiceUnavailable.status,
                            headers=headers)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": served_name, "object": "model", "owned_by": "sglang-omni",
            "root": config.model_path, "pipeline": config.config_cls,
        }]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    stage_names = tuple(orchestrator.stages.handles)

    async def open_run(rid: str, messages: list, sampling: dict, stage_params: dict,
                       stage_sampling: dict) -> UMMRun:
        """Check the generation limits, measure the history off the event loop, open the run
        (400/503 before any model work)."""
        check_generation_limits(
            stage_params.get("generation") or {}, config.server,
            where="stage_params.generation.", feeds_reasoner=True,
            multiple=size_multiple(config.stages["generation"].factory.get("backend")
                                   if "generation" in config.stages else None))
        history_size = await asyncio.to_thread(history_bytes, messages)
        return orchestrator.open_interleaved(UMMRequest(
            rid=rid, messages=messages, sampling=sampling, stage_params=stage_params,
            stage_sampling=stage_sampling, media_policy=orchestrator.policy,
            history_size=history_size))

    async def open_claimed_run(rid: str, *args: Any) -> UMMRun:
        """``open_run`` for a claimed rid: refused (400/503 before any work), the rid is free
        again; admitted, it ends with the run (``Orchestrator.release``)."""
        try:
            return await open_run(rid, *args)
        except BaseException:
            orchestrator.ids.forget(rid)
            raise

    async def respond_interleaved(request: Request, run: UMMRun, stream_form: Any,
                                  json_form: Any) -> Response:
        events = orchestrator.interleaved_events(run)
        if stream_form is not None:
            # An async function: Starlette runs a sync background function in a worker
            # thread, and the orchestrator's state belongs to the event loop.
            async def end_run() -> None:
                orchestrator.end_interleaved(run)

            return sse_response(stream_form(events), config.server.sse_keepalive_s,
                                background=BackgroundTask(end_run))
        try:
            done = await until_disconnect(request, collect(events))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        finally:
            await events.aclose()
            orchestrator.end_interleaved(run)
        # base64 and JSON of up to 17 media segments: off the event loop
        return await json_response_off_loop(lambda: json_form(done))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json_body(request)
        if orchestrator.mode == "generation":
            raise BadRequest("/v1/chat/completions: this server runs Cosmos3PipelineConfig "
                             "(direct generation); use the image, video and action routes")
        req = parse_chat_request(body, known_stages=stage_names)
        check_chat_request(body, orchestrator.policy)
        orchestrator.check_healthy()
        model = req.model or served_name
        if orchestrator.mode == "chat":
            return await _text_chat(request, orchestrator, req, model)
        if req.response_format is not None:
            raise BadRequest("response_format: the interleaved pipeline sets the Reasoner's "
                             "decision format itself; remove response_format")
        if req.extra.get("logprobs") or req.extra.get("return_logprob"):
            raise BadRequest("logprobs: interleaved results carry no logprobs; leave it unset")
        rid = orchestrator.ids.claim(req.rid)
        run = await open_claimed_run(rid, req.messages, req.sampling, req.stage_params,
                                     req.stage_sampling)
        stream_form = (lambda ev: chat_sse(rid, model, req.include_usage, ev)) \
            if req.stream else None
        return await respond_interleaved(request, run, stream_form,
                                         lambda done: chat_json(rid, model, done))

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_json_body(request)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if orchestrator.mode != "umm":
            if body.get("stream"):
                raise BadRequest("/generate: stream=true is served only by the interleaved "
                                 "pipeline (Cosmos3UMMPipelineConfig); set stream to false")
            raise BadRequest(f"/generate is served by the interleaved pipeline; this server "
                             f"runs {config.config_cls}")
        req = parse_generate_request(body, stage_names)
        check_chat_request(req.chat_body, orchestrator.policy)
        orchestrator.check_healthy()
        rid = orchestrator.ids.claim(req.rid)
        run = await open_claimed_run(rid, req.messages, req.sampling, req.stage_params,
                                     req.stage_sampling)
        return await respond_interleaved(request, run,
                                         (lambda ev: generate_sse(ev, rid)) if req.stream else None,
                                         lambda done: generate_json(rid, done))

    if orchestrator.mode == "generation":
        app.include_router(generation_routes(orchestrator, served_name))
    return app


async def _text_chat(request: Request, orchestrator: Orchestrator, req: ChatRequest,
                     model: str) -> Response:
    """One Reasoner completion. Admission (503) comes before the request id is used and before
    the stage loads any media; the ticket is released when the request ends."""
    ticket = orchestrator.admit_text_chat()
    handed_over = False
    rid: str | None = None
    try:
        rid = orchestrator.ids.claim(req.rid)
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


async def _text_chat_sse(rid: str, model: str, req: ChatRequest, first: Any,
                         stream: AsyncGenerator[Any, None], ticket: AdmissionTicket | None,
                         ids: RequestIds | None = None) -> AsyncIterator[str]:
    async def items() -> AsyncIterator[Any]:
        yield first
        async for item in stream:
            yield item

    yield sse_data(chunk_body(rid, model, {"role": "assistant", "content": ""}))
    try:
        async for item in items():
            if isinstance(item, StageResult):
                usage = item.payload.get("usage") if req.include_usage else None
                yield sse_data(chunk_body(rid, model, {}, item.payload.get("finish_reason",
                                                                           "stop"), usage))
            elif item.get("text"):
                yield sse_data(chunk_body(rid, model, {"content": item["text"]}))
    except Exception as exc:  # noqa: BLE001 - every stream ends with an error and [DONE]
        yield sse_data(stream_error(exc, rid).to_body())
    finally:
        await stream.aclose()
        _release(ticket)
        if ids is not None:
            ids.finish(rid)
    yield SSE_DONE
