"""Each HTTP request runs inside its request state (``pipeline.request_state``).

:class:`HoldRequestStates` (pure ASGI) enters ``orchestrator.request()`` around the whole HTTP
exchange, the route and its response (a stream to its last byte, or until its client left), and
puts the state in the scope; a route reads it with :func:`request_state`. The state's exit, when
the exchange ends however it ends, is the request's one release: routes never release anything
themselves. As the response's last byte goes to the server the state is marked answered: what
counts it against admission ends then, before its client can send the next request. A state
that acquired nothing (``/health``, ``/metrics``) costs one object.

The scope outlives the exchange (uvicorn's connection keeps its last request's scope until the
next request, or until the connection object is freed), so the state leaves the scope as the
exchange ends: a finished request's run and media are freed as its last reference goes, never
left for the cyclic garbage collector. :class:`FinishedInMemory` counts the finished requests
still in memory (``sgl_omni_finished_requests_in_memory``: 0 on a server at rest).
"""

from __future__ import annotations

import itertools
import weakref
from typing import cast

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.request_state import RequestState

STATE_KEY = "sglang_omni.request_state"


class FinishedInMemory:
    """The finished requests whose state or run is still in memory, held by weak references
    (counting keeps nothing alive). A request is added as its exchange ends; it leaves the
    count when the last of its objects is freed."""

    def __init__(self) -> None:
        self._held: dict[int, list[weakref.ref[object]]] = {}
        self._serial = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def add(self, *objects: object) -> None:
        key = next(self._serial)
        held = self._held

        def gone(ref: weakref.ref[object]) -> None:
            refs = held.get(key)
            if refs is None:
                return
            refs[:] = [r for r in refs if r is not ref]
            if not refs:
                del held[key]

        refs = [weakref.ref(obj, gone) for obj in objects if obj is not None]
        if refs:
            held[key] = refs


class HoldRequestStates:
    """Runs each HTTP request inside its own ``orchestrator.request()``; ``finished`` (when
    given) counts the finished ones still in memory."""

    def __init__(self, app: ASGIApp, orchestrator: Orchestrator,
                 finished: FinishedInMemory | None = None) -> None:
        self.app = app
        self.orchestrator = orchestrator
        self.finished = finished

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with self.orchestrator.request() as state:
            scope[STATE_KEY] = state

            async def send_marking(message: Message) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    state.mark_answered()  # before the client can have it
                await send(message)

            try:
                await self.app(scope, receive, send_marking)
            finally:
                # The scope outlives the exchange (see the module docstring): it must not keep
                # the finished request's run and media reachable.
                del scope[STATE_KEY]
                if self.finished is not None:
                    self.finished.add(state, state.run)


def request_state(request: Request) -> RequestState:
    """The state of ``request`` (an HTTP request of the app, see the module docstring)."""
    return cast(RequestState, request.scope[STATE_KEY])
