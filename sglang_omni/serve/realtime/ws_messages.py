"""WebSocket messages of the realtime routes: binary msgpack frames, bounded like HTTP bodies.

:func:`receive` returns the next binary message, or None once the client left. A message is
at most ``server.max_body_bytes`` (uvicorn closes a larger one with 1009, ``ws_max_size``), its
bytes count in the server's body budget while uvicorn buffers it (:mod:`.ws_protocol`), and
:func:`decode` checks it as an HTTP msgpack body is checked (depth, wire values, numpy maps;
400 naming the path). The sessions themselves are admitted and owned by the pipeline
(``pipeline.admission.realtime``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest, OmniError
from sglang_omni.serve.bodies.msgpack_body import decode_msgpack, pack_msgpack

log = logging.getLogger("sglang_omni.serve")

#: Close codes (RFC 6455): normal end, policy violation, unexpected server condition.
WS_NORMAL = 1000
WS_POLICY_VIOLATION = 1008
WS_INTERNAL_ERROR = 1011
#: ... and "try again later" (RFC 6455 registry): a message over the server's body budget.
WS_TRY_AGAIN_LATER = 1013
#: Longest close reason in bytes (a close frame's payload is at most 125 bytes).
MAX_REASON_BYTES = 120


def settings_of(websocket: WebSocket) -> ServerSettings:
    settings = getattr(websocket.app.state, "server_settings", None)
    return settings if isinstance(settings, ServerSettings) else ServerSettings()


async def receive(websocket: WebSocket) -> bytes | None:
    """The next binary message; None when the client left; BadRequest for a text frame."""
    try:
        message = await websocket.receive()
    except (WebSocketDisconnect, RuntimeError):
        return None
    if message["type"] == "websocket.disconnect":
        return None
    data = message.get("bytes")
    if data is None:
        raise BadRequest("messages are binary msgpack frames, not text")
    return data


def decode(websocket: WebSocket, data: bytes, binary_ok: Collection[str] = ()) -> Any:
    """A received message, checked as an HTTP msgpack body is (400 naming the path)."""
    settings = settings_of(websocket)
    if len(data) > settings.max_body_bytes:
        raise BadRequest(f"the message is larger than {settings.max_body_bytes} bytes "
                         "(server.max_body_bytes)")
    return decode_msgpack(data, settings.max_json_depth, binary_ok, settings.max_json_values)


async def send(websocket: WebSocket, value: Any) -> bool:
    """Send one msgpack message; False when the client is gone."""
    try:
        await websocket.send_bytes(pack_msgpack(value))
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False
    return True


def reason(text: str) -> str:
    """A close reason that fits a close frame."""
    return text.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


async def close(websocket: WebSocket, code: int, why: str = "") -> None:
    if websocket.application_state == WebSocketState.DISCONNECTED or \
            websocket.client_state == WebSocketState.DISCONNECTED:
        return
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code, reason(why))


def error_body(exc: OmniError) -> dict[str, Any]:
    """The error object (``{"message", "type", "code"}``) of every error message."""
    return exc.to_body()["error"]
