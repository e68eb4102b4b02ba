"""Shutdown with requests in flight (SIGTERM or SIGINT, as a rolling deploy drains a server).

uvicorn stops accepting connections, waits for the requests in flight and, after its
``timeout_graceful_shutdown``, cancels them: a cancelled request gets no answer of ours (a
stream is cut mid-body, a JSON request gets a plain-text 500). :class:`DrainingServer` starts
the orchestrator's drain when shutdown begins instead: new requests get 503 at once, those in
flight may run ``server.shutdown_grace_s`` seconds, and the orchestrator then ends those still
running itself, each with 503 "the server is shutting down" through its route's error path (a
stream's error event and ``[DONE]``, a JSON body with ``Retry-After``). uvicorn's own timeout
comes :data:`END_S` later and only cuts what could not answer by then (a client that stopped
reading, for example).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from collections.abc import Iterator

import uvicorn

from sglang_omni.pipeline.orchestrator import Orchestrator

#: Seconds the requests ended after the grace period have to send their answer before uvicorn
#: cancels what is left.
END_S = 3.0


def uvicorn_timeout(grace_s: float) -> int:
    """uvicorn's ``timeout_graceful_shutdown`` for a grace of ``grace_s`` seconds."""
    return math.ceil(grace_s + END_S)


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains ``orchestrator`` when it shuts down (see the module
    docstring); build its config with ``timeout_graceful_shutdown=uvicorn_timeout(grace_s)``."""

    def __init__(self, config: uvicorn.Config, orchestrator: Orchestrator,
                 grace_s: float) -> None:
        super().__init__(config)
        self.orchestrator = orchestrator
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        draining = asyncio.create_task(self.orchestrator.drain(self.grace_s), name="drain")
        try:
            await super().shutdown(sockets)
        finally:
            draining.cancel()
            await asyncio.gather(draining, return_exceptions=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, less the signal it raises again once it has stopped: by then the server
        has drained and stopped its stages, and ``sgl-omni serve`` exits 0 (raised again, SIGINT
        ends the process with a KeyboardInterrupt traceback and exit status -2, and SIGTERM
        kills it before its exit code is chosen)."""
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()
