"""The FastAPI application: the lifespan owns the orchestrator and what the mode's routes own;
the routes of the pipeline's mode translate the wire (one router module per mode)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import OmniError, ServiceUnavailable
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.auth import ApiKeyAuth
from sglang_omni.serve.chat_routes import chat_routes
from sglang_omni.serve.direct_routes import direct_routes
from sglang_omni.serve.docs import docs_router
from sglang_omni.serve.http_errors import install_error_handlers
from sglang_omni.serve.interleaved_routes import interleaved_routes
from sglang_omni.serve.metrics import build_registry
from sglang_omni.serve.mode_routes import ModeRoutes
from sglang_omni.serve.responses import json_response
from sglang_omni.serve.schemas.responses import Health, ModelList
from sglang_omni.serve.typed_route import OmniRoute

#: A body without Content-Type is read as JSON (the body reader refuses other types with 415);
#: FastAPI releases that check the type themselves take this switch, older ones read it so.
LENIENT_CONTENT_TYPE: dict[str, Any] = {"strict_content_type": False} \
    if "strict_content_type" in inspect.signature(FastAPI).parameters else {}
#: The routes of each pipeline mode (``PipelineSpec.mode``).
MODE_ROUTES: dict[str, Callable[[Orchestrator, str], ModeRoutes]] = {
    "umm": interleaved_routes,
    "chat": chat_routes,
    "generation": direct_routes,
}


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
    routes = MODE_ROUTES[orchestrator.mode](orchestrator, served_name)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await orchestrator.start()
        try:
            yield
        finally:
            try:
                for close in routes.closers:
                    await close()
            finally:
                await orchestrator.stop()

    app = FastAPI(title="SGLang Omni", lifespan=lifespan, docs_url=None, redoc_url=None,
                  **LENIENT_CONTENT_TYPE,
                  description=f"Serving {config.config_cls}. Errors are "
                  '`{"error": {"message", "type", "code"}}`.')
    app.router.route_class = OmniRoute
    app.state.orchestrator = orchestrator
    app.state.server_settings = config.server
    if config.server.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=config.server.api_key)
    install_error_handlers(app, error_response)  # outermost: JSON 500s, 401s included
    registry = build_registry(orchestrator)

    @app.exception_handler(OmniError)
    async def _omni_error(_: Request, exc: OmniError) -> Response:
        return error_response(exc, config.server.retry_after_s)

    @app.get("/health", responses={200: {"model": Health}, 503: {"model": Health}})
    async def health() -> Response:
        """``ok`` (200) or ``stalled``/``restarting``/``unhealthy`` (503), per stage."""
        report = orchestrator.health()
        ok = report["status"] == "ok"
        headers = None if ok else {"Retry-After": str(config.server.retry_after_s)}
        return JSONResponse(report, status_code=200 if ok else ServiceUnavailable.status,
                            headers=headers)

    @app.get("/v1/models", responses={200: {"model": ModelList}})
    async def models() -> Response:
        """The one served model."""
        return json_response({"object": "list", "data": [{
            "id": served_name, "object": "model", "owned_by": "sglang-omni",
            "root": config.model_path, "pipeline": config.config_cls,
        }]})

    @app.get("/metrics", responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        """Prometheus metrics (``sgl_omni_*``)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(routes.router)
    app.include_router(docs_router(app.title))
    return app
