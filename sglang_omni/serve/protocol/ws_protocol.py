"""The WebSocket protocol the server runs: uvicorn's (on the websockets library's sans-I/O
core) with the bytes each connection buffers counted in the server's body budget.

uvicorn holds a client's message in memory before the app sees it: the frame being received (up
to ``server.max_body_bytes``) and one complete message waiting for the app (reading pauses until
the app takes it). Many connections each sending messages of the largest size would otherwise
take gigabytes outside ``server.max_pending_body_bytes``. Each connection here holds a
:class:`~sglang_omni.serve.bodies.body_budget.BodyLease` covering those bytes, resized as data
arrives
and as the app takes messages, and given back when the connection ends. A connection whose
buffered bytes do not fit beside the other bodies being read is closed with 1013 (try again
later), a reason naming the limit, and its bytes are dropped; the app sees a disconnect.

A client that stops reading makes the connection's send buffer fill and the app's next send
wait. It waits at most ``server.send_timeout_s``: then the connection is aborted (what it
buffered for the client is dropped) and the send fails as for a client that left, so a client
that stopped reading holds neither its session nor the server's memory.

Why subclass, and which uvicorn: uvicorn has no public hook to count or bound what a WebSocket
connection buffers, or to bound a send to a client that reads nothing, so this subclasses its
private ``WebSocketsSansIOProtocol``. Checked against uvicorn 0.52.1, 0.53.0, 0.54.0 and 0.55.0
(pyproject: ``uvicorn>=0.52.1,<0.56``): before 0.52.1 the class has no ``disconnected`` (0.35 to
0.52.0 would fail here on the first send); 0.55.0 answers an unparsable handshake itself (431,
414 or 400), which ``_answer_unparsed_handshake`` does for the earlier releases.
tests/wire/test_uvicorn_internals.py fails when an overridden method or a field used is gone;
tests/wire/test_ws_budget.py (the budget, 1013), tests/wire/test_connections.py (the
unparsable handshake) and tests/generation/test_realtime_ws.py (a client that stops reading)
pin the behaviours.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, ClassVar

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from sglang_omni.errors import ServiceUnavailable
from sglang_omni.serve.bodies.body_budget import BodyBudget, BodyLease
from sglang_omni.serve.realtime.ws_messages import WS_TRY_AGAIN_LATER

log = logging.getLogger("sglang_omni.serve")

OVER_BUDGET_REASON = "server busy reading other requests (max_pending_body_bytes); retry"


class BudgetedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, its buffered message bytes under :attr:`budget`, a send
    waiting at most :attr:`send_timeout_s` for an unread client (class attributes:
    :func:`ws_protocol_for` makes the class of a server)."""

    budget: ClassVar[BodyBudget]
    send_timeout_s: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lease: BodyLease = self.budget.lease()
        self._queued: deque[int] = deque()  # sizes of the messages waiting for the app

    def buffered_bytes(self) -> int:
        """The message bytes this connection holds that the app has not taken: unparsed input
        (a frame being received), the fragments of a message, the messages queued."""
        reader = getattr(self.conn, "reader", None)
        unparsed = len(getattr(reader, "buffer", b""))
        return unparsed + sum(len(f) for f in self.frames) + sum(self._queued)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if (not self.handshake_initiated and self.conn.handshake_exc is not None
                and not self.close_sent):  # uvicorn >= 0.55 answered it itself
            self._answer_unparsed_handshake()
            return
        self._charge()

    def send_receive_event_to_app(self) -> None:
        size = sum(len(f) for f in self.frames)
        before = self.queue.qsize()
        super().send_receive_event_to_app()
        if self.queue.qsize() > before:
            self._queued.append(size)

    async def receive(self) -> Any:
        message = await super().receive()
        if message.get("type") == "websocket.receive" and self._queued:
            self._queued.popleft()
        self._charge()
        return message

    async def send(self, message: Any) -> None:
        if not self.writable.is_set() and not self.disconnected:
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await self.writable.wait()
            except TimeoutError:
                log.warning("WebSocket %s: the client read nothing for %g s "
                            "(server.send_timeout_s); disconnecting it",
                            self.scope.get("path", "?"), self.send_timeout_s)
                self.transport.abort()
                raise ClientDisconnected() from None
        await super().send(message)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._queued.clear()
            self.lease.close()

    def _charge(self) -> None:
        if self.disconnected or self.close_sent:
            self.lease.close()
            return
        try:
            self.lease.resize(self.buffered_bytes())
        except ServiceUnavailable as exc:
            self._refuse(exc)

    def _answer_unparsed_handshake(self) -> None:
        """A handshake the websockets library could not parse (a header line over its 8 KiB,
        too many headers, not HTTP): send the HTTP error it answered with (431, 414) and close.
        uvicorn sends nothing there, so the connection stayed open for good."""
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.lease.close()
        self.transport.close()

    def _refuse(self, exc: ServiceUnavailable) -> None:
        """Close the connection (1013): its buffered bytes do not fit in the budget."""
        log.warning("closing a WebSocket connection of %s: %s", self.scope.get("path", "?")
                    if self.handshake_complete else "?", exc.message)
        self.frames = []
        self._queued.clear()
        self.lease.close()
        if not self.handshake_complete:
            self.transport.close()
            return
        self.conn.send_close(WS_TRY_AGAIN_LATER, OVER_BUDGET_REASON)
        self.handle_parser_exception()


def ws_protocol_for(budget: BodyBudget, send_timeout_s: float
                    ) -> type[BudgetedWebSocketProtocol]:
    """The protocol class for ``uvicorn.Config(ws=...)`` charging ``budget``, its sends
    waiting at most ``send_timeout_s`` for a client that reads nothing."""
    return type("ServerWebSocketProtocol", (BudgetedWebSocketProtocol,),
                {"budget": budget, "send_timeout_s": send_timeout_s})
