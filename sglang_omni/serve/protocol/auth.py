"""Who may call: the ``--api-key`` check, as pure ASGI middleware.

With a key set, every HTTP and WebSocket request except ``/health``, the API documentation
(``/docs``, ``/redoc``, their assets and ``/openapi.json``) and the playground page (``/``,
``/playground`` and its assets), which a browser loads without a bearer header and which hold no
secret (the page asks for the key and sends it on the API calls it makes; the list lives in
:mod:`.service_paths`), must carry
``Authorization: Bearer KEY`` (compared in constant time). Others get 401 in the JSON error
shape with ``WWW-Authenticate: Bearer``; a WebSocket is closed before it opens (uvicorn then
refuses the handshake with 403).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_omni.errors import Unauthorized
from sglang_omni.serve.ops.service_paths import is_open
from sglang_omni.serve.realtime.ws_messages import WS_POLICY_VIOLATION


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's ``Authorization: Bearer`` header, or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


class ApiKeyAuth:
    """Refuse requests without the server's bearer key (:func:`is_open` paths stay open)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode("utf-8")

    def authorized(self, scope: Scope) -> bool:
        token = bearer_token(scope)
        return token is not None and hmac.compare_digest(token, self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_open(scope.get("path", "")) \
                or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION,
                        "reason": "missing or invalid API key"})
            return
        missing = bearer_token(scope) is None
        error = Unauthorized(
            "Authorization: " + ("missing; send 'Authorization: Bearer <key>' with the server's "
                                 "API key" if missing else
                                 "the API key is not valid; send the key the server was started "
                                 "with (--api-key or SGLANG_OMNI_API_KEY)"))
        body = json.dumps(error.to_body()).encode()
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
