"""``OmniRoute``: FastAPI routes whose typed body is read by Omni's own bounded readers.

FastAPI would read a declared body model with its own JSON decoding (no size, time, depth or
wire-value limits). An ``OmniRoute`` with a body reads it first through
:func:`~sglang_omni.serve.body_formats.read_route_body`: JSON by default, a form or msgpack
where the route's OpenAPI entry lists them (``body_formats.accepts``); 415/413/408/400 come
before any parsing work. FastAPI then validates the checked value into the route's model; a
validation error becomes the 400 of :mod:`sglang_omni.serve.validation`. The format read is
``request.state.body_format``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter

from sglang_omni.serve.body_formats import formats_of, read_route_body


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
            # FastAPI reads ``body()`` (any non-empty bytes) then ``json()``: both answer from
            # these caches, so the body is parsed once, by the reader. The content type is the
            # JSON one from here on, so FastAPI never parses a form itself.
            request._body = b"{}"
            request._json = value
            request.scope["headers"] = [
                (k, v) for k, v in request.scope["headers"] if k.lower() != b"content-type"
            ] + [(b"content-type", b"application/json")]
            request.__dict__.pop("_headers", None)
            return await handler(request)

        return read_then_handle


def omni_router() -> APIRouter:
    """A router whose routes are :class:`OmniRoute` (every route module builds its own)."""
    return APIRouter(route_class=OmniRoute)
