"""Each HTTP request runs inside its request state (``pipeline.request_state``).

:class:`HoldRequestStates` (pure ASGI) enters ``orchestrator.request()`` around the whole HTTP
exchange, the route and its response (a stream to its last byte, or until its client left), and
puts the state in the scope; a route reads it with :func:`request_state`. The state's exit, when
the exchange ends however it ends, is the request's one release: routes never release anything
themselves. As the response's last byte goes to the server the state is marked answered: what
counts it against admission ends then, before its client can send the next request. A state
that acquired nothing (``/health``, ``/metrics``) costs one object.
"""

from __future__ import annotations

from typing import cast

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.request_state import RequestState

STATE_KEY = "sglang_omni.request_state"


class HoldRequestStates:
    """Runs each HTTP request inside its own ``orchestrator.request()``."""

    def __init__(self, app: ASGIApp, orchestrator: Orchestrator) -> None:
        self.app = app
        self.orchestrator = orchestrator

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
                # The scope outlives the exchange: uvicorn's connection keeps it (a cycle,
                # freed only by the cyclic collector, when the connection is closed), so it
                # must not keep the finished request's run and media reachable.
                del scope[STATE_KEY]


def request_state(request: Request) -> RequestState:
    """The state of ``request`` (an HTTP request of the app, see the module docstring)."""
    return cast(RequestState, request.scope[STATE_KEY])
