"""Connection timeouts for uvicorn's h11 server: idle, slow headers, slow bodies.

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` seconds, but only after a
response, and has no header or body deadline. :class:`GuardedH11Protocol` adds them:

* a new connection that sends nothing for ``server.idle_timeout_s`` is closed;
* once the first byte of a request arrives, its headers must be complete within
  ``server.header_timeout_s``, else the connection is closed;
* a request body must be complete within ``server.body_timeout_s``; the JSON routes answer 408
  at that moment (``request_body``), and this closes the connection a grace period later for
  routes that never read the body;
* a client that reads nothing of its answer while the connection's send buffer is full (a
  stream it stopped reading) for ``server.send_timeout_s`` has its connection aborted: the
  request then ends as for a client that left, its work cancelled (a stalled reader would
  otherwise hold its request, past its deadline, for as long as it stays connected).

Framing: a request with both ``Content-Length`` and ``Transfer-Encoding`` is answered 400 and
its connection closed before anything after it is read (RFC 9112 section 6.1: h11 alone reads it
as chunked and keeps the connection, so a request smuggled behind it would be served).

Why subclass, and which uvicorn: uvicorn has no public hook for header, body or send deadlines
(only ``timeout_keep_alive``, armed after a response) or for bounding a stalled reader, so
:class:`GuardedH11Protocol` and :class:`BoundedFlow` subclass its private ``H11Protocol`` and
``FlowControl``. Checked against uvicorn 0.52.1, 0.53.0, 0.54.0 and 0.55.0 (pyproject:
``uvicorn>=0.52.1,<0.56``); these classes changed in 0.52.1 and 0.55.0 (the keep-alive timer's
reset moved, the WebSocket upgrade hands data over after the new protocol is made).
tests/wire/test_uvicorn_internals.py fails when an overridden method or a field used is gone;
tests/wire/test_connections.py pins each behaviour above (idle, slow head, slow body, a body no
route reads, keep-alive then idle, the 400 JSON answer, a stalled reader, the framing refusal);
tests/generation/test_realtime_ws.py that a WebSocket outlives them once upgraded (without the
upgrade hook the body deadline cut a session after 3 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Callable
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.body_budget import BodyBudget
from sglang_omni.serve.protocol.ws_protocol import ws_protocol_for

#: Largest request head (request line and headers) h11 buffers, in bytes (h11's default).
MAX_HEADER_BYTES = 16 * 1024
#: Seconds after ``body_timeout_s`` before the connection itself is closed.
BODY_GRACE_S = 2.0

log = logging.getLogger("sglang_omni.serve")


class BoundedFlow(FlowControl):
    """uvicorn's write flow control whose wait for a paused transport (a full send buffer)
    lasts at most ``timeout_s``; then ``on_stall`` runs (it aborts the connection).

    ``on_stall`` is held weakly when it is a bound method (the protocol's, whose ``flow`` this
    is): a strong one would make protocol and flow a reference cycle, and a closed
    connection, with its last request's scope, would stay in memory until the cyclic collector
    ran."""

    def __init__(self, transport: asyncio.Transport, timeout_s: float,
                 on_stall: Callable[[], None]) -> None:
        super().__init__(transport)
        self.timeout_s = timeout_s
        self._on_stall: Callable[[], Callable[[], None] | None] = \
            weakref.WeakMethod(on_stall) if hasattr(on_stall, "__self__") \
            else lambda: on_stall

    async def drain(self) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await super().drain()
        except TimeoutError:
            on_stall = self._on_stall()
            if on_stall is not None:
                on_stall()


class FramedConnection(h11.Connection):
    """h11's server connection that refuses a request framed two ways (``Content-Length`` and
    ``Transfer-Encoding``) as a protocol error; :attr:`refusal` says why, for the 400."""

    refusal: str | None = None

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                self.refusal = ("a request may not carry both Content-Length and "
                                "Transfer-Encoding (RFC 9112 section 6.1); send one of them")
                raise h11.RemoteProtocolError(self.refusal)
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body deadlines (see the module docstring).
    ``settings`` is set on a subclass by :func:`protocol_for`."""

    settings: ServerSettings = ServerSettings()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size
        self.conn: FramedConnection = FramedConnection(
            h11.SERVER, DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if size is None else size)
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind: str | None = None  # "head" or "body"
        self._upgraded = False  # a WebSocket protocol owns the transport now

    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire)
        self._deadline_kind = kind

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_kind = None

    def _expire(self) -> None:
        self._deadline = self._deadline_kind = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _sync(self) -> None:
        """Follow the client's side of the exchange: a complete head stops the header deadline
        and a request body starts the body deadline; a complete body stops that."""
        state = self.conn.their_state
        if self._upgraded:
            self._disarm()
        elif state is h11.IDLE:
            if self._deadline_kind == "body":
                self._disarm()
        elif state is h11.SEND_BODY:
            if self._deadline_kind != "body":
                self._arm("body", self.settings.body_timeout_s + BODY_GRACE_S)
        else:
            self._disarm()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = BoundedFlow(transport, self.settings.send_timeout_s, self._stalled)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def _stalled(self) -> None:
        path = self.scope.get("path", "?") if self.scope else "?"
        log.warning("%s: the client read nothing of its answer for %g s "
                    "(server.send_timeout_s); closing its connection", path,
                    self.settings.send_timeout_s)
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._deadline is None:
            self._arm("head", self.settings.header_timeout_s)
        super().data_received(data)
        self._sync()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True
        self._disarm()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (bad syntax, a head over MAX_HEADER_BYTES) or framed two
        ways: 400 in the JSON error shape, then close (nothing after it on the connection is
        read)."""
        if self.conn.refusal is not None:
            error = BadRequest(f"invalid HTTP request: {self.conn.refusal}")
        else:
            error = BadRequest(
                f"invalid HTTP request ({msg.rstrip('.')}); check the request line and headers "
                f"(at most {MAX_HEADER_BYTES} bytes)")
        body = json.dumps(error.to_body()).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        head = h11.Response(status_code=error.status, headers=headers, reason=b"Bad Request")
        for event in (head, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def protocol_for(settings: ServerSettings) -> type[GuardedH11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with ``settings``' timeouts."""
    return type("ServerH11Protocol", (GuardedH11Protocol,), {"settings": settings})


def uvicorn_options(settings: ServerSettings, budget: BodyBudget) -> dict[str, Any]:
    """uvicorn.Config keywords for ``settings``: protocol, idle timeout, head size, the largest
    WebSocket message (``server.max_body_bytes``, as for a request body), and the WebSocket
    protocol that counts the message bytes it buffers in ``budget`` (the app's body budget)
    and drops a client that reads nothing for ``server.send_timeout_s``."""
    return {"http": protocol_for(settings), "timeout_keep_alive": settings.idle_timeout_s,
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
            "ws_max_size": settings.max_body_bytes,
            "ws": ws_protocol_for(budget, settings.send_timeout_s)}
