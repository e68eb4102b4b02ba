"""Every HTTP answer that is an error is JSON: ``{"error": {"message", "type", "code"}}``.

:func:`install_error_handlers` maps FastAPI's own refusals (404, 405, request validation) to
``OmniError`` answers, and :class:`JsonServerErrors` (pure ASGI, so it sits inside Starlette's
plain-text ``ServerErrorMiddleware`` and sees every exception) answers an unexpected exception
with a generic 500, logging the traceback; internal exception text never reaches a client.
Refusals that leave a request body unread (408, 413) also close the connection.

This is the wire module of the error rules: the only place outside ``sglang_omni.errors`` that
names an HTTP status (:data:`CLIENT_CLOSED_REQUEST`, and the statuses of Starlette's refusals).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    OmniError,
    PayloadTooLarge,
    RequestTooSlow,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
    is_client_error,
)
from sglang_omni.serve.wire.responses import json_response
from sglang_omni.serve.wire.validation import bad_request_of

log = logging.getLogger("sglang_omni.serve")

#: The status (nginx's) of the answer to a request whose client left before it (no client reads
#: it; the access log shows it).
CLIENT_CLOSED_REQUEST = 499
#: Statuses whose answer closes the connection: the body was not (fully) read.
CLOSE_AFTER = (RequestTooSlow.status, PayloadTooLarge.status)
GENERIC_500 = ("the server failed this request unexpectedly; the error is logged on the server. "
               "Retry, and report it if it persists")

def retry_after(retry_after_s: int, wait_s: float | None = None) -> int:
    """The Retry-After seconds of a 503: ``wait_s`` (the known wait until a retry can succeed,
    a restart's cool-down) rounded up, never less than the server's ``retry_after_s``."""
    return retry_after_s if wait_s is None else max(retry_after_s, math.ceil(wait_s))


def error_response(exc: OmniError,
                   retry_after_s: int = ServerSettings.retry_after_s) -> Response:
    """The JSON error answer. A 503 carries ``Retry-After`` unless the server will not come
    back by itself (:class:`~sglang_omni.errors.NeedsRestart`), a 408 or 413 ``Connection:
    close`` (the rest of that body is not read); the body is ASCII JSON, so no message text
    can fail to encode."""
    unavailable = exc.retry_later if isinstance(exc, ServiceUnavailable) \
        else exc.status == ServiceUnavailable.status
    wait = exc.retry_after_s if isinstance(exc, ServiceUnavailable) else None
    headers = {"Retry-After": str(retry_after(retry_after_s, wait))} if unavailable else {}
    if exc.status in CLOSE_AFTER:
        headers["Connection"] = "close"
    return json_response(exc.to_body(), exc.status, headers or None)


_BY_STATUS: dict[int, type[OmniError]] = {
    cls.status: cls for cls in (BadRequest, Unauthorized, NotFound, MethodNotAllowed,
                                PayloadTooLarge, UnsupportedMediaType)}


def http_exception_error(request: Request, exc: HTTPException) -> OmniError:
    """The OmniError for one of Starlette's HTTPExceptions (its detail only for 4xx)."""
    if exc.status_code == NotFound.status:
        return NotFound(f"{request.url.path}: no such route on this server; see GET /v1/models "
                        "and the README for the routes served")
    if exc.status_code == MethodNotAllowed.status:
        return MethodNotAllowed(f"{request.method} {request.url.path}: method not allowed; use "
                                f"{(exc.headers or {}).get('Allow', 'another method')}")
    cls = _BY_STATUS.get(exc.status_code)
    if cls is None or not is_client_error(exc.status_code):
        return ServerError(GENERIC_500)
    return cls(str(exc.detail))


def validation_error(exc: RequestValidationError) -> BadRequest:
    """400 naming the first invalid field of a request model (:mod:`.validation`)."""
    return bad_request_of(exc.errors())


def install_error_handlers(app: FastAPI, respond: Callable[[OmniError], Response]) -> None:
    """Answer FastAPI's own refusals with ``respond`` (the app's OmniError responder) and wrap
    the app in :class:`JsonServerErrors`."""

    @app.exception_handler(HTTPException)
    async def _http_exception(request: Request, exc: HTTPException) -> Response:
        response = respond(http_exception_error(request, exc))
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        return respond(validation_error(exc))

    app.add_middleware(JsonServerErrors)


class JsonServerErrors:
    """Pure ASGI: an exception before the response started becomes a generic JSON 500; one after
    it ends the response (logged either way). 408/413 answers get ``Connection: close``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] in CLOSE_AFTER:
                    headers = [h for h in message.get("headers", ())
                               if h[0].lower() != b"connection"]
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                return
            error = ServerError(GENERIC_500)
            body = json.dumps(error.to_body()).encode()
            await send({"type": "http.response.start", "status": error.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
