"""JSON responses that cannot fail to encode, and large ones built off the event loop.

Bodies are ASCII JSON (``json.dumps`` defaults): a string the client sent that is not valid
Unicode (a lone surrogate such as ``"\\ud800"``) is escaped, never an encoding error after the
work was done. Bodies holding media (base64 of megabytes) are built on a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import Response

from sglang_omni.serve.wire_json import dumps_bytes


def json_response(content: Any, status_code: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    """``content`` as an ASCII JSON response."""
    return Response(dumps_bytes(content), status_code=status_code, headers=headers,
                    media_type="application/json")


async def json_response_off_loop(build: Callable[[], Any], status_code: int = 200) -> Response:
    """``json_response(build())``, built and encoded on a worker thread (large bodies)."""
    return await asyncio.to_thread(lambda: json_response(build(), status_code))
