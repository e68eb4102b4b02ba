"""Run a non-streaming handler until it finishes or the client goes away (then cancel it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from sglang_omni.aio.race import race

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection; the work was cancelled."""


async def until_disconnect(request: Request, work: Awaitable[T], poll_s: float = 0.1) -> T:
    """``work``'s result; ClientDisconnected (``work`` cancelled and awaited) when the client
    leaves first."""
    finish = await race(work, _gone(request, poll_s))
    if finish.index == 1:
        raise ClientDisconnected()
    result: T = finish.value
    return result


async def _gone(request: Request, poll_s: float) -> None:
    """Returns once the client closed the connection (checked every ``poll_s``)."""
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)
