"""The SDK's WebSocket sessions: realtime video and realtime actions (msgpack messages).

* :meth:`RealtimeClients.realtime_video` opens ``/v1/realtime_video/generate``: iterate the
  session for :class:`VideoChunk` items (each an MP4 the caller may ``save``), steer it with
  :meth:`RealtimeVideo.set_prompt`, and close it (which aborts the chunk in flight).
* :meth:`RealtimeClients.realtime_actions` opens ``/v1/actions/realtime``: ``metadata`` is the
  server's first message; :meth:`RealtimeActions.generate` sends one action request and returns
  its answer, whose action ``values`` are numpy arrays.

A server error message raises :class:`~sglang_omni.client.types.OmniClientError`. These need the
``websockets`` package (a dependency of the server as well).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from sglang_omni.client.types import OmniClientError

#: Close codes of a normal end.
NORMAL_CLOSE = (1000, 1001)


def _connect(base_url: str, path: str, headers: dict[str, str], timeout: float | None) -> Any:
    try:
        from websockets.sync.client import connect
    except ImportError:  # pragma: no cover - websockets ships with the server's dependencies
        raise RuntimeError("the realtime sessions need the websockets package: pip install "
                           "websockets") from None
    url = "ws" + base_url.removeprefix("http") + path
    connection = connect(url, additional_headers=headers, max_size=None, open_timeout=timeout)
    return connection.__enter__()  # the session object owns it (closed by its close())


def _native(value: Any) -> Any:
    """Native's array maps as numpy arrays, recursively."""
    if isinstance(value, dict):
        marker = value.get(b"__ndarray__", value.get("__ndarray__"))
        if marker:
            get = value.get
            data: Any = get(b"data", get("data"))
            dtype, shape = get(b"dtype", get("dtype")), get(b"shape", get("shape"))
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        return {k: _native(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_native(v) for v in value]
    return value


def _error(message: dict[str, Any]) -> OmniClientError:
    error = message.get("error")
    if isinstance(error, dict):  # realtime video: {"type": "error", "content", "error": {...}}
        return OmniClientError(int(error.get("code", 500)), str(error.get("message")),
                               str(error.get("type", "")))
    return OmniClientError(int(message.get("code", 500)), str(error or message.get("content")),
                           str(message.get("type", "")))


@dataclass(frozen=True)
class VideoChunk:
    """One chunk of a realtime video session: an MP4 of ``num_frames`` frames."""

    index: int
    request_id: str
    num_frames: int
    content_type: str
    data: bytes = field(repr=False)
    event_id: int | None = None

    def save(self, path: str | Path) -> Path:
        """Write the chunk to a new file (never over an existing one); the caller owns it."""
        target = Path(path)
        with open(target, "xb") as f:
            f.write(self.data)
        return target


class RealtimeVideo:
    """A realtime video session (iterate it for chunks; close it to end and abort)."""

    def __init__(self, connection: Any, init: dict[str, Any]) -> None:
        self._ws = connection
        self._ws.send(msgpack.packb({"type": "init", **init}, use_bin_type=True))

    def set_prompt(self, prompt: str, event_id: int | None = None) -> None:
        """The chunks after this one follow ``prompt``."""
        event: dict[str, Any] = {"type": "event", "kind": "prompt", "payload": prompt}
        if event_id is not None:
            event["event_id"] = event_id
        self._ws.send(msgpack.packb(event))

    def __iter__(self) -> Iterator[VideoChunk]:
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                raw = self._ws.recv()
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else None
                if code in NORMAL_CLOSE:
                    return
                raise OmniClientError(500, f"the session closed with code {code}") from None
            message = msgpack.unpackb(raw, raw=False)
            if message.get("type") == "error":
                raise _error(message)
            if message.get("type") == "frame_batch":
                yield VideoChunk(int(message["chunk_index"]), str(message["request_id"]),
                                 int(message["num_frames"]), str(message["content_type"]),
                                 bytes(message["payload"]), message.get("event_id"))

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> RealtimeVideo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RealtimeActions:
    """A realtime action connection: ``metadata``, then one :meth:`generate` at a time."""

    def __init__(self, connection: Any) -> None:
        self._ws = connection
        self.metadata: dict[str, Any] = msgpack.unpackb(self._ws.recv(), raw=False)

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """One action request; the answer's action ``values`` are numpy arrays. An error
        raises (and the server closes the connection, as native does)."""
        self._ws.send(msgpack.packb(request, use_bin_type=True))
        answer = msgpack.unpackb(self._ws.recv(), raw=False, strict_map_key=False)
        if "error" in answer:
            raise _error(answer)
        return dict(_native(answer))

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> RealtimeActions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RealtimeClients:
    """``realtime_video`` and ``realtime_actions`` of ``Client``."""

    _base_url: str
    _headers: dict[str, str]
    _timeout: float | None

    def realtime_video(self, prompt: str, **init: Any) -> RealtimeVideo:
        """Open a realtime video session; ``init`` holds the video route's fields, plus
        ``first_frame`` (image bytes or a reference) and ``max_chunks``."""
        connection = _connect(self._base_url, "/v1/realtime_video/generate", self._headers,
                              self._timeout)
        return RealtimeVideo(connection, {**init, "prompt": prompt})

    def realtime_actions(self) -> RealtimeActions:
        """Open a realtime action connection."""
        return RealtimeActions(_connect(self._base_url, "/v1/actions/realtime", self._headers,
                                        self._timeout))
