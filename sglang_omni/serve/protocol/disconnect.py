"""Run a non-streaming handler until it finishes or the client goes away (then cancel it).

The client's going is heard, not polled: a watcher awaits the connection's next ASGI message,
which the server gives as ``http.disconnect`` when the client closes it (the request's body has
been read by then, so the watcher takes nothing the handler needs)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from sglang_omni.aio.race import race

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection; the work was cancelled."""


async def _client_gone(request: Request) -> None:
    """Return once the client closed the connection."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; ClientDisconnected (``work`` cancelled and awaited) when the client
    goes first."""
    finish = await race(work, _client_gone(request))
    if finish.index == 1:
        raise ClientDisconnected()
    result: T = finish.value
    return result
