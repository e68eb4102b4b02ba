"""The playground: a small page at ``/`` and ``/playground`` that talks to this server's public
API only (``GET /v1/models``, ``/server_info``, ``/health``, ``/v1/queue``; ``POST
/v1/chat/completions`` streaming, the image, video and action routes). Its HTML, script and
style are package data (``sglang_omni/serve/playground/``), served by the server itself: no CDN,
no build step.

The page and its assets are open without the API key (:mod:`.auth`); the page asks for the key
when the server answers 401 and keeps it in the browser tab's ``sessionStorage`` only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from sglang_omni.errors import NotFound

ASSETS_PATH = "/playground/assets"
PAGE_DIR = Path(__file__).parent.parent / "playground"
#: The asset files the page loads, by URL name, with their media types.
ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "sha256.js": "text/javascript"}
#: The page and its assets never change while a server runs, but do between releases.
CACHE = {"Cache-Control": "no-cache"}


def playground_router() -> APIRouter:
    """``GET /``, ``GET /playground`` and the page's assets."""
    router = APIRouter(include_in_schema=False)

    async def page() -> Response:
        return FileResponse(PAGE_DIR / "index.html", media_type="text/html", headers=CACHE)

    router.add_api_route("/", page, methods=["GET"])
    router.add_api_route("/playground", page, methods=["GET"])

    @router.get(ASSETS_PATH + "/{name}")
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"{ASSETS_PATH}/{name}: no such playground asset")
        return FileResponse(PAGE_DIR / name, media_type=media_type, headers=CACHE)

    return router
