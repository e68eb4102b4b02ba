"""``scale.asgi_call.run_asgi`` closed while its app runs: the app gets its grace, and a closer
cancelled during that grace still sees its cancellation once the app ended (it used to be
swallowed, so the closer went on as if nothing had happened). No Ray is involved."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sglang_omni.scale.asgi_call import run_asgi


def test_a_closer_cancelled_during_the_grace_is_cancelled_after_the_app_ended() -> None:
    events: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await asyncio.Event().wait()  # ignores the disconnect
        finally:
            events.append("app cancelled")

    async def main() -> None:
        seen: list[asyncio.Event] = []

        def receiver(gone: asyncio.Event) -> Any:
            seen.append(gone)

            async def receive() -> dict[str, Any]:
                await gone.wait()
                return {"type": "http.disconnect"}
            return receive

        stream = run_asgi(app, {"type": "http"}, receiver, grace_s=3600)
        assert (await anext(stream))[0]["type"] == "http.response.start"
        closer = asyncio.create_task(stream.aclose())  # the caller went away
        await seen[0].wait()  # the app is told; its grace runs
        closer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closer
        assert events == ["app cancelled"]

    asyncio.run(main())
