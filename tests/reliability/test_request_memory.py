"""Nothing of a finished request stays in the server (issue 26, 5.9: the last request's run was
kept by a background task's copied context, and its media until a full garbage collection, so
the server's memory crept by a request's media at a time). Checked with the collector off: what
a request held must go when its last reference does. The soak figure is
``benchmarks/memory_creep.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

from sglang_omni.serve.ops.request_log import RequestRecorder, note_run


class Media:
    """Stands for the media a request holds (weakly referenceable)."""


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_task_a_request_started_does_not_keep_its_run() -> None:
    """A task started while a request is served copies its context (the request's record):
    once the request has ended, that must not keep the request's run."""
    gone: list[weakref.ref[Media]] = []
    outliving: list[asyncio.Task[None]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        run = Media()
        gone.append(weakref.ref(run))
        note_run(run)
        outliving.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    class Sink:
        def in_flight(self, delta: int) -> None:
            pass

        def request_ended(self, *args: Any) -> None:
            pass

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    async def serve() -> None:
        scope = {"type": "http", "method": "POST", "path": "/generate", "headers": []}
        await RequestRecorder(app, Sink())(scope, receive, send)
        assert not outliving[0].done()
        assert gone[0]() is None, "the finished request's run is still held"
        outliving[0].cancel()

    with collector_off():
        asyncio.run(serve())
