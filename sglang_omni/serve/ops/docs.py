"""``/docs`` (Swagger UI) and ``/redoc`` served with no CDN: the page assets come from the
``fastapi-offline`` package's static folder and are served by this server under
:data:`ASSETS_PATH`, so the pages work on a machine without internet.

The pages, their assets and ``/openapi.json`` (served here too) are open without the API key
(:mod:`sglang_omni.serve.protocol.auth`).
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from sglang_omni.errors import NotFound

ASSETS_PATH = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
#: The asset files the pages load, by URL name.
ASSETS = {name: ASSETS_DIR / name for name in (
    "swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")}


def docs_router(title: str, openapi_url: str = "/openapi.json") -> APIRouter:
    """The two documentation pages, their assets and the OpenAPI schema (a route of its own, so
    the request log and metrics label it ``/openapi.json``)."""
    router = APIRouter(include_in_schema=False)

    @router.get(openapi_url)
    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi())

    @router.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title} - API",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png")

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url, title=f"{title} - API",
                              redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
                              with_google_fonts=False)

    @router.get(ASSETS_PATH + "/{name}")
    async def asset(name: str) -> FileResponse:
        path = ASSETS.get(name)
        if path is None or not path.is_file():
            raise NotFound(f"{ASSETS_PATH}/{name}: no such documentation asset")
        return FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})

    return router
