"""The FastAPI application: the lifespan owns the orchestrator and what the mode's routes own;
the routes of the pipeline's mode translate the wire (one router module per mode).

By default the lifespan starts every stage before the server answers (a stage that fails fails
startup). ``sgl-omni serve`` passes ``background_start``: the server answers at once, ``/health``
says ``starting`` (503) while the stages load, ``on_ready`` runs when they are all ready and
``on_startup_failure`` when one failed (``app.state.startup_error`` holds the error).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sglang_omni.config import random_weights
from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.errors import OmniError, ServiceUnavailable
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.bodies.body_budget import BodyBudget
from sglang_omni.serve.bodies.typed_route import OmniRoute
from sglang_omni.serve.chat.chat_routes import chat_routes
from sglang_omni.serve.chat.interleaved_routes import interleaved_routes
from sglang_omni.serve.direct.routes import direct_routes
from sglang_omni.serve.ops.docs import docs_router
from sglang_omni.serve.ops.info_routes import add_server_info_route
from sglang_omni.serve.ops.metrics import ServerMetrics
from sglang_omni.serve.ops.mode_routes import ModeRoutes
from sglang_omni.serve.ops.playground_routes import playground_router
from sglang_omni.serve.ops.request_log import RequestRecorder
from sglang_omni.serve.protocol.auth import ApiKeyAuth
from sglang_omni.serve.protocol.request_states import FinishedInMemory, HoldRequestStates
from sglang_omni.serve.schemas.responses import Health, ModelList
from sglang_omni.serve.schemas.server_openapi import serve_narrowed_openapi
from sglang_omni.serve.wire.http_errors import (
    error_response,
    install_error_handlers,
    retry_after,
)
from sglang_omni.serve.wire.responses import json_response

#: A body without Content-Type is read as JSON (the body reader refuses other types with 415);
#: FastAPI releases that check the type themselves take this switch, older ones read it so.
LENIENT_CONTENT_TYPE: dict[str, Any] = {"strict_content_type": False} \
    if "strict_content_type" in inspect.signature(FastAPI).parameters else {}
log = logging.getLogger("sglang_omni.serve")
#: The routes of each pipeline mode (``Orchestrator.mode``).
MODE_ROUTES: dict[str, Callable[[Orchestrator, str], ModeRoutes]] = {
    "umm": interleaved_routes,
    "chat": chat_routes,
    "generation": direct_routes,
}


def create_app(config: ResolvedConfig, model_name: str | None = None,
               log_level: str = "info", *, log_format: str = "text",
               background_start: bool = False,
               on_ready: Callable[[], Awaitable[None]] | None = None,
               on_startup_failure: Callable[[], None] | None = None,
               log_polls: bool = False, prepared: Orchestrator | None = None) -> FastAPI:
    """Build the app; stages start in the lifespan (see the module docstring). ``log_polls``
    logs polls in the request log too (:mod:`.service_paths`). ``prepared``: an orchestrator
    built for ``config`` already, whose stages may have been spawned (``StageSet.spawn``); the
    lifespan then waits for those processes."""
    orchestrator = prepared if prepared is not None else Orchestrator(config, log_level,
                                                                      log_format)
    served_name = model_name or config.model_path or config.config_cls
    routes = MODE_ROUTES[orchestrator.mode](orchestrator, served_name)

    async def start_stages() -> None:
        try:
            await orchestrator.start()
        except Exception as exc:  # noqa: BLE001 - reported, then the server stops
            app.state.startup_error = exc
            log.error("startup failed: %s", exc)
            if on_startup_failure is not None:
                on_startup_failure()
            return
        if on_ready is not None:
            try:
                await on_ready()
            except Exception:  # noqa: BLE001 - the stages run; the hook's failure is logged
                log.exception("the server is ready, but its on_ready hook failed")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        starting: asyncio.Task | None = None
        if background_start:
            starting = asyncio.get_running_loop().create_task(start_stages())
        else:
            await orchestrator.start()
        try:
            yield
        finally:
            try:
                if starting is not None and not starting.done():
                    starting.cancel()
                    await asyncio.gather(starting, return_exceptions=True)
                for close in routes.closers:
                    await close()
            finally:
                await orchestrator.stop()

    app = FastAPI(title="SGLang Omni", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,  # served by docs_router, under its own route label
                  **LENIENT_CONTENT_TYPE,
                  description=f"Serving {config.config_cls}. Errors are "
                  '`{"error": {"message", "type", "code"}}`.')
    app.router.route_class = OmniRoute
    app.state.orchestrator = orchestrator
    app.state.server_settings = config.server
    app.state.body_budget = BodyBudget(config.server.max_pending_body_bytes)
    app.state.startup_error = None
    #: The checkpoint's random-weight note (None for trained weights), read once.
    app.state.random_weights = random_weights.read(config.model_path)
    if config.server.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=config.server.api_key)
    serve_narrowed_openapi(app, config.server)  # x264_preset: the allowed presets only
    install_error_handlers(app, error_response)  # JSON 500s, 401s included
    server_metrics = ServerMetrics(orchestrator)
    orchestrator.observer = server_metrics
    app.state.metrics = server_metrics
    server_metrics.watch_body_budget(app.state.body_budget)
    finished = FinishedInMemory()
    server_metrics.watch_finished(finished)
    # each request's state spans its whole exchange; its exit is the request's one release
    app.add_middleware(HoldRequestStates, orchestrator=orchestrator, finished=finished)
    app.add_middleware(RequestRecorder, sink=server_metrics,  # outermost: every request
                       log_polls=log_polls)
    registry = server_metrics.registry

    @app.exception_handler(OmniError)
    async def _omni_error(_: Request, exc: OmniError) -> Response:
        return error_response(exc, config.server.retry_after_s)

    @app.get("/health", responses={200: {"model": Health}, 503: {"model": Health}})
    async def health() -> Response:
        """``ok`` (200) or ``starting``/``stalled``/``restarting``/``unhealthy`` (503), per
        stage. A 503 but ``unhealthy`` carries ``Retry-After``: while a stage waits to restart
        (its restart budget spent, it cools down), the seconds until its restart (its
        ``restart_in_s``, rounded up), at least ``server.retry_after_s``."""
        report = orchestrator.health()
        ok = report["status"] == "ok"
        # "unhealthy" does not come back by itself: no Retry-After (NeedsRestart's rule)
        retry = not ok and report["status"] != "unhealthy"
        waits = [s["restart_in_s"] for s in report["stages"].values()
                 if s.get("restart_in_s") is not None]
        wait = retry_after(config.server.retry_after_s, max(waits, default=None))
        headers = {"Retry-After": str(wait)} if retry else None
        return JSONResponse(report, status_code=200 if ok else ServiceUnavailable.status,
                            headers=headers)

    @app.get("/v1/models", responses={200: {"model": ModelList}})
    async def models() -> Response:
        """The one served model."""
        return json_response({"object": "list", "data": [{
            "id": served_name, "object": "model", "owned_by": "sglang-omni",
            "root": config.model_path, "pipeline": config.config_cls,
            "mode": orchestrator.mode,
        }]})

    @app.get("/metrics", responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        """Prometheus metrics (``sgl_omni_*``)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    add_server_info_route(app.router, config, orchestrator.mode, served_name,
                          app.state.random_weights)
    app.include_router(routes.router)
    app.include_router(docs_router(app.title))
    app.include_router(playground_router())
    return app
