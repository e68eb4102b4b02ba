"""``OmniRoute``: FastAPI routes whose typed body is read by Omni's own bounded readers.

FastAPI would read a declared body model with its own JSON decoding (no size, time, depth or
wire-value limits). An ``OmniRoute`` with a body reads it first through
:func:`~sglang_omni.serve.bodies.body_formats.read_route_body`: JSON by default, a form or msgpack
where the route's OpenAPI entry lists them (``body_formats.accepts``); 415/413/408/400 come
before any parsing work. FastAPI then validates the checked value into the route's model; a
validation error becomes the 400 of :mod:`sglang_omni.serve.wire.validation`. The format read is
``request.state.body_format``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette.datastructures import Headers, MutableHeaders

from sglang_omni.serve.bodies.body_formats import formats_of, read_route_body


class ReadBodyRequest(Request):
    """A request whose body was already read and checked by ``read_route_body``: ``body()``
    and ``json()`` answer with that value and ``headers`` name the JSON content type, so
    FastAPI validates the value without reading or parsing the body again (FastAPI's documented
    custom-``Request`` pattern; no private field of Starlette's ``Request`` is written). The
    route's endpoint receives this request: its ``headers`` then show ``application/json``
    whatever the client sent (``request.state.body_format`` says what it was)."""

    def __init__(self, request: Request, value: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._value = value
        self._json_headers = MutableHeaders(scope={"type": "http", "headers": [
            (k, v) for k, v in request.scope["headers"] if k.lower() != b"content-type"]})
        self._json_headers["content-type"] = "application/json"

    @property
    def headers(self) -> Headers:
        return self._json_headers

    async def body(self) -> bytes:
        return b"{}"  # non-empty: FastAPI then asks for json()

    async def json(self) -> Any:
        return self._value


class OmniRoute(APIRoute):
    """An APIRoute whose body goes through ``read_route_body`` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler
        extra = formats_of(self.openapi_extra)
        properties: dict[str, Any] = {}
        model: Any = getattr(self.body_field.field_info, "annotation", None)
        if extra and hasattr(model, "model_json_schema"):
            properties = model.model_json_schema().get("properties", {})

        async def read_then_handle(request: Request) -> Response:
            kind, value = await read_route_body(request, extra, properties)
            request.state.body_format = kind
            return await handler(ReadBodyRequest(request, value))

        return read_then_handle


def omni_router() -> APIRouter:
    """A router whose routes are :class:`OmniRoute` (every route module builds its own)."""
    return APIRouter(route_class=OmniRoute)
