"""``OmniRoute``: FastAPI routes whose typed JSON body is read by Omni's one body reader.

FastAPI would read a declared body model with its own JSON decoding (no size, time, depth or
wire-value limits). An ``OmniRoute`` with a body reads it first through
:func:`~sglang_omni.serve.request_body.read_json_body` (415/413/408/400 before any parsing
work), then hands FastAPI the checked value, which validates it into the route's model; a
validation error becomes the 400 of :mod:`sglang_omni.serve.validation`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter

from sglang_omni.serve.request_body import read_json_body


class OmniRoute(APIRoute):
    """An APIRoute whose JSON body goes through ``read_json_body`` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def read_then_handle(request: Request) -> Response:
            value = await read_json_body(request)
            # FastAPI reads ``body()`` (any non-empty bytes) then ``json()``: both answer from
            # these caches, so the body is parsed once, by the reader.
            request._body = b"{}"
            request._json = value
            return await handler(request)

        return read_then_handle


def omni_router() -> APIRouter:
    """A router whose routes are :class:`OmniRoute` (every route module builds its own)."""
    return APIRouter(route_class=OmniRoute)
