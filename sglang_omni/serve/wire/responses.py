"""JSON responses that cannot fail to encode, and large ones built off the event loop.

Bodies are ASCII JSON (``json.dumps`` defaults): a string the client sent that is not valid
Unicode (a lone surrogate such as ``"\\ud800"``) is escaped, never an encoding error after the
work was done. Bodies holding media (base64 of megabytes) are built on a worker thread, small
ones on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sglang_omni.serve.wire.wire_json import dumps_bytes

#: A response whose content holds fewer bytes than this (text, media) is built on the event loop:
#: a worker thread's hand-off costs more than encoding it (on 2 cores, about 0.1 ms and two
#: context switches a request).
OFF_LOOP_BYTES = 64 * 1024
#: A body is handed to the server this many bytes at a time: each piece is copied on the event
#: loop (the HTTP framing, the socket's buffer), and the loop serves others between pieces.
SEND_WINDOW = 1024 * 1024


class WindowedResponse(Response):
    """A response whose body goes to the server :data:`SEND_WINDOW` bytes at a time (one
    ``Content-Length`` body all the same), so megabytes of media are not copied in one step."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = memoryview(self.body)
        if len(body) <= SEND_WINDOW or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        for at in range(0, len(body), SEND_WINDOW):
            await send({"type": "http.response.body", "body": body[at:at + SEND_WINDOW],
                        "more_body": at + SEND_WINDOW < len(body)})
        if self.background is not None:
            await self.background()


def json_response(content: Any, status_code: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    """``content`` as an ASCII JSON response."""
    return WindowedResponse(dumps_bytes(content), status_code=status_code, headers=headers,
                            media_type="application/json")


async def json_response_off_loop(build: Callable[[], Any], status_code: int = 200,
                                 content_bytes: int | None = None) -> Response:
    """``json_response(build())``, built and encoded on a worker thread; on the event loop when
    ``content_bytes`` (what the content holds, about) is under :data:`OFF_LOOP_BYTES`."""
    if content_bytes is not None and content_bytes < OFF_LOOP_BYTES:
        return json_response(build(), status_code)
    return await asyncio.to_thread(lambda: json_response(build(), status_code))
