"""One HTTP request or WebSocket session run through an ASGI app inside this process, its
answer as message batches.

A replica runs the whole Omni FastAPI app in its own process and serves each request the gateway
forwards to it (:mod:`~sglang_omni.scale.gateway`) through :func:`call_asgi`. The app sees what
uvicorn would give it: the body at once, then ``http.disconnect`` when the caller goes away.
Closing or cancelling the iterator is the caller going away: the app is told the client
disconnected (what it sends of an HTTP answer from then on is dropped, as uvicorn drops it; a
WebSocket send raises OSError) and given ``grace_s`` to end (so an abort reaches the stages, as
on one server) before it is cancelled. A WebSocket session runs the same way
(:func:`run_asgi`), its client's messages taken from a queue the relay fills
(:func:`websocket_receiver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from sglang_omni.aio.merge import keep_alive
from sglang_omni.aio.race import race, to_the_end

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Messages the app may send ahead of a slow caller before its ``send`` waits (backpressure).
MAX_AHEAD = 64
#: Seconds the app has to end after the caller went away, before it is cancelled.
GRACE_S = 10.0
_END: Message = {"type": "_end"}
#: The last item of a replica's stream when the app ended (a stream that stops without it was
#: cut: its replica died, which Ray does not always report as an error).
STREAM_END = "sglang_omni.stream_end"
#: An item a replica's stream carries while its app has sent nothing for :data:`KEEPALIVE_S`:
#: the replica is alive (a stream silent for longer is a frozen replica, not a slow answer).
KEEPALIVE = "sglang_omni.keepalive"
#: Seconds without a message from the app after which the replica sends :data:`KEEPALIVE`.
KEEPALIVE_S = 1.0


class StreamCut(Exception):  # noqa: N818 - what happened, as RayActorError names it
    """A replica's stream stopped before :data:`STREAM_END`: the replica died."""


def http_scope(request: dict[str, Any]) -> Scope:
    """The ASGI ``http`` scope of a request forwarded as :func:`forwarded` built it."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.get("http_version", "1.1"), "method": request["method"],
        "scheme": request.get("scheme", "http"), "path": request["path"],
        "raw_path": request.get("raw_path") or request["path"].encode(),
        "query_string": request.get("query_string", b""), "root_path": "",
        "headers": [tuple(h) for h in request.get("headers", [])],
        "client": request.get("client"), "server": request.get("server"), "state": {},
    }


def websocket_scope(request: dict[str, Any]) -> Scope:
    """The ASGI ``websocket`` scope of a session forwarded as :func:`forwarded` built it."""
    scope = http_scope(request)
    scope["type"] = "websocket"
    scope["scheme"] = request.get("scheme", "ws")
    scope["subprotocols"] = list(request.get("subprotocols", []))
    del scope["method"]
    return scope


def forwarded(scope: Scope, body: bytes) -> dict[str, Any]:
    """What a replica needs of an ``http`` request: its scope's plain fields and its body."""
    return {
        "http_version": scope.get("http_version", "1.1"), "method": scope.get("method", "GET"),
        "scheme": scope.get("scheme", "http"), "path": scope["path"],
        "raw_path": scope.get("raw_path"), "query_string": scope.get("query_string", b""),
        "headers": [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])],
        "client": tuple(scope["client"]) if scope.get("client") else None,
        "server": tuple(scope["server"]) if scope.get("server") else None,
        "subprotocols": list(scope.get("subprotocols", [])),
        "body": body,
    }


async def call_asgi(app: ASGIApp, scope: Scope, body: bytes, grace_s: float = GRACE_S,
                    context: contextvars.Context | None = None
                    ) -> AsyncIterator[list[Message]]:
    """Run ``app`` for one request (in ``context`` when given); yield the messages it sends, in
    batches (all that are ready).

    An exception the app raises is raised here after the messages it sent. See the module
    docstring for what closing the iterator early does.
    """
    body_given = False

    def receiver(gone: asyncio.Event) -> Receive:
        async def receive() -> Message:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}
        return receive

    async for batch in run_asgi(app, scope, receiver, grace_s, context):
        yield batch


def with_keepalive(batches: AsyncIterator[list[Message]], every_s: float = KEEPALIVE_S
                   ) -> AsyncGenerator[list[Message] | str, None]:
    """``batches``, with :data:`KEEPALIVE` yielded after each ``every_s`` that brought none.
    Closing this iterator closes ``batches`` (its next batch, if awaited, is cancelled)
    (:func:`~sglang_omni.aio.merge.keep_alive`)."""
    return keep_alive(batches, every_s, KEEPALIVE)


def websocket_receiver(inbound: asyncio.Queue[Message]) -> Callable[[asyncio.Event], Receive]:
    """The ``receive`` of a relayed WebSocket session: the client's messages as the relay puts
    them on ``inbound``; once the caller has gone, ``websocket.disconnect`` (code 1006)."""
    def receiver(gone: asyncio.Event) -> Receive:
        async def receive() -> Message:
            if gone.is_set() and inbound.empty():
                return {"type": "websocket.disconnect", "code": 1006}
            finish = await race(inbound.get(), gone.wait())
            if finish.index == 0:
                message: Message = finish.value
                return message
            return {"type": "websocket.disconnect", "code": 1006}
        return receive
    return receiver


async def run_asgi(app: ASGIApp, scope: Scope, receiver: Callable[[asyncio.Event], Receive],
                   grace_s: float = GRACE_S, context: contextvars.Context | None = None
                   ) -> AsyncIterator[list[Message]]:
    """Run ``app`` on ``scope`` with ``receiver(gone)`` as its ``receive`` (``gone`` is set when
    the caller goes away); yield the messages it sends, in batches (all that are ready).

    An exception the app raises is raised here after the messages it sent. Closing the iterator
    early sets ``gone``, gives the app ``grace_s`` to end, then cancels it.
    """
    queue: asyncio.Queue[Message] = asyncio.Queue(MAX_AHEAD)
    gone = asyncio.Event()
    receive = receiver(gone)

    async def send(message: Message) -> None:
        if gone.is_set():  # as uvicorn does on a closed connection:
            if scope["type"] == "http":
                return  # an answer is dropped (the app saw ``http.disconnect``)
            raise OSError("the client went away")  # a WebSocket send fails
        await queue.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(_END)

    task = asyncio.get_running_loop().create_task(run(), context=context)
    finished = False
    try:
        while True:
            batch = [await _next(queue, task)]
            while not queue.empty():
                batch.append(queue.get_nowait())
            finished = batch[-1] is _END
            if finished:
                batch.pop()
            if batch:
                yield batch
            if finished:
                break
        await task
    finally:
        if not task.done():
            gone.set()
            _drain(queue)
            cancelled = False
            try:
                async with asyncio.timeout(grace_s):
                    await asyncio.shield(task)
            except TimeoutError:
                pass
            except asyncio.CancelledError:  # the caller's (not the app's): raised after the
                current = asyncio.current_task()  # app ended
                cancelled = current is not None and current.cancelling() > 0
            if not task.done():
                task.cancel()
            await to_the_end(asyncio.gather(task, return_exceptions=True))
            if cancelled:
                raise asyncio.CancelledError()


async def _next(queue: asyncio.Queue[Message], task: asyncio.Future[None]) -> Message:
    """The next message, or the end once the app has ended with nothing more queued (the end
    marker may not fit a full queue, so the app's end also counts)."""
    if not queue.empty():
        return queue.get_nowait()
    finish = await race(queue.get(), asyncio.wait({task}))  # the app runs on if it loses
    if finish.index == 0:
        message: Message = finish.value
        return message
    return queue.get_nowait() if not queue.empty() else _END


def _drain(queue: asyncio.Queue[Message]) -> None:
    """Empty the queue, so an app blocked in ``send`` wakes (and learns the client is gone)."""
    while not queue.empty():
        queue.get_nowait()
