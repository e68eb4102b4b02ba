"""A request through an ASGI app in-process (what a replica does with a forwarded request):
the app gets the body, its messages come back in order, and closing the iterator early is a
client disconnect the app sees (then, past the grace time, it is cancelled). Needs no Ray."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from sglang_omni.scale.asgi_call import call_asgi, forwarded, http_scope
from sglang_omni.serve.wire.http_errors import JsonServerErrors


def make_app(events: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"body": (await request.body()).decode(),
                             "q": request.query_params.get("q"),
                             "h": request.headers.get("x-test")}, status_code=201)

    async def stream(request: Request) -> StreamingResponse:
        async def chunks() -> Any:
            try:
                for i in range(1000):
                    yield f"chunk {i}\n"
                    await asyncio.sleep(0.01)
            finally:
                events.append("stream closed")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def stubborn(request: Request) -> JSONResponse:
        try:
            await asyncio.sleep(60)
        finally:
            events.append("cancelled")
        return JSONResponse({})

    async def broken(request: Request) -> JSONResponse:
        raise RuntimeError("boom")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/stream", stream),
                             Route("/stubborn", stubborn), Route("/broken", broken)])


def request(path: str, body: bytes = b"", query: bytes = b"", method: str = "GET"
            ) -> dict[str, Any]:
    scope = {"type": "http", "method": method, "path": path, "query_string": query,
             "headers": [(b"x-test", b"yes"), (b"content-length", str(len(body)).encode())],
             "client": ("10.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    return forwarded(scope, body)


async def collect(app: Starlette, req: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    async for batch in call_asgi(app, http_scope(req), req["body"]):
        out.extend(batch)
    return out


def test_the_app_gets_the_request_and_its_answer_comes_back() -> None:
    messages = asyncio.run(collect(make_app([]), request("/echo", b"hello", b"q=1", "POST")))
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 201
    body = b"".join(m.get("body", b"") for m in messages[1:])
    assert body == b'{"body":"hello","q":"1","h":"yes"}'
    assert messages[-1].get("more_body", False) is False


def test_closing_early_is_a_disconnect_the_app_sees() -> None:
    events: list[str] = []

    async def main() -> int:
        seen = 0
        stream = call_asgi(make_app(events), http_scope(request("/stream")), b"")
        async for batch in stream:
            seen += sum(1 for m in batch if m.get("body"))
            if seen >= 3:
                break
        await stream.aclose()
        return seen

    assert asyncio.run(main()) >= 3
    assert events == ["stream closed"]


def test_an_app_that_ignores_the_disconnect_is_cancelled_after_the_grace() -> None:
    events: list[str] = []

    async def main() -> None:
        stream = call_asgi(make_app(events), http_scope(request("/stubborn")), b"", grace_s=0.2)
        task = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.1)
        task.cancel()  # the caller goes away while the app has sent nothing
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()

    asyncio.run(asyncio.wait_for(main(), 5))
    assert events == ["cancelled"]


def test_an_answer_the_app_sends_after_the_caller_left_is_dropped_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """As uvicorn drops what an app sends on a closed connection: an app that answers once it
    sees the disconnect (a replica whose gateway gave up on the call) is no unhandled error."""
    entered, answered = asyncio.Event(), asyncio.Event()

    async def late(request: Request) -> JSONResponse:
        entered.set()
        while (await request.receive())["type"] != "http.disconnect":
            pass
        answered.set()
        return JSONResponse({"too": "late"})

    app = JsonServerErrors(Starlette(routes=[Route("/late", late)]))

    async def main() -> None:
        stream = call_asgi(app, http_scope(request("/late")), b"", grace_s=5)
        task = asyncio.ensure_future(anext(stream))
        await entered.wait()  # the app runs and waits for the disconnect
        task.cancel()  # the caller goes away while the app has sent nothing
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()

    with caplog.at_level(logging.INFO):
        asyncio.run(asyncio.wait_for(main(), 10))
    assert answered.is_set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_app_exception_reaches_the_caller() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(collect(make_app([]), request("/broken")))


def test_a_websocket_session_takes_the_relayed_messages_and_sees_the_caller_leave() -> None:
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    from sglang_omni.scale.asgi_call import run_asgi, websocket_receiver, websocket_scope

    events: list[Any] = []

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                events.append(text := await ws.receive_text())
                await ws.send_text(text.upper())
        except WebSocketDisconnect as gone:
            events.append(gone.code)

    app = Starlette(routes=[WebSocketRoute("/ws", echo)])
    scope = websocket_scope({**forwarded({"method": "GET", "path": "/ws", "headers": []}, b""),
                             "scheme": "ws"})

    async def session() -> list[Any]:
        inbound: asyncio.Queue = asyncio.Queue()
        for message in ({"type": "websocket.connect"},
                        {"type": "websocket.receive", "text": "a"},
                        {"type": "websocket.receive", "text": "b"}):
            inbound.put_nowait(message)
        sent: list[Any] = []
        stream = run_asgi(app, scope, websocket_receiver(inbound), grace_s=5)
        async for batch in stream:
            sent.extend(batch)
            if len(sent) == 3:
                break
        await stream.aclose()  # the caller leaves: the app sees a disconnect
        return sent

    sent = asyncio.run(session())
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.send"]
    assert [m["text"] for m in sent[1:]] == ["A", "B"]
    assert events == ["a", "b", 1006]


def test_a_slow_answer_carries_keepalives_and_closing_still_disconnects() -> None:
    from sglang_omni.scale.asgi_call import KEEPALIVE, with_keepalive

    events: list[str] = []
    app = make_app(events)

    async def slow_then_close() -> tuple[list[Any], list[Any]]:
        # /stubborn sends nothing for 60 s: keep-alives come meanwhile
        stream = with_keepalive(call_asgi(app, http_scope(request("/stubborn")), b"",
                                          grace_s=0.2), every_s=0.05)
        items = [await anext(stream) for _ in range(3)]
        await stream.aclose()  # the caller leaves: the app is told, then cancelled
        # a quick answer passes through whole, with no keep-alive needed
        answer = [item async for item in with_keepalive(
            call_asgi(app, http_scope(request("/echo", b"hi", method="POST")), b"hi"),
            every_s=5)]
        return items, answer

    items, answer = asyncio.run(asyncio.wait_for(slow_then_close(), 10))
    assert items == [KEEPALIVE] * 3
    assert events == ["cancelled"]
    messages = [m for batch in answer for m in batch]
    assert messages[0]["status"] == 201
    assert b"".join(m.get("body", b"") for m in messages[1:]) == b'{"body":"hi","q":null,"h":"yes"}'
