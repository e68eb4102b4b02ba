"""The request head's size limit of ``sgl-omni serve``'s own HTTP server, as pure ASGI
middleware around the app.

h11 refuses a head (request line and headers) over ``connection.MAX_HEADER_BYTES`` only while
it is incomplete: one that arrives whole in a single read is parsed whatever its size. Here
every HTTP request and WebSocket handshake is measured as it was sent (request line, and each
header as ``name: value`` with its line end): one over the limit gets 431 in the JSON error
shape (a WebSocket handshake is refused: uvicorn answers 403), so the limit holds however the
bytes arrived. It wraps the app where the server runs it (``startup.run_server``), not inside
the app: in a Ray Serve fleet the HTTP server in front is Ray's proxy, which adds headers of its
own (``x-request-id``) before a replica sees the request.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_omni.errors import HeadersTooLarge
from sglang_omni.serve.protocol.connection import MAX_HEADER_BYTES
from sglang_omni.serve.realtime.ws_messages import WS_POLICY_VIOLATION
from sglang_omni.serve.wire.http_errors import error_response


def head_bytes(scope: Scope) -> int:
    """The size of the request's head as sent: ``METHOD target HTTP/x`` and its headers."""
    target = len(scope.get("raw_path") or scope.get("path", "").encode())
    query = scope.get("query_string", b"")
    line = len(scope.get("method", "GET")) + 1 + target + (1 + len(query) if query else 0) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))


class HeadLimit:
    """Refuse requests whose head is over ``limit`` bytes (see the module docstring)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = head_bytes(scope) if scope["type"] in ("http", "websocket") else 0
        if size <= self.limit:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION,
                        "reason": f"request headers over {self.limit} bytes"})
            return
        error = HeadersTooLarge(f"the request line and headers are {size} bytes, over the "
                                f"server's {self.limit}; send fewer or shorter headers")
        await error_response(error)(scope, receive, send)
