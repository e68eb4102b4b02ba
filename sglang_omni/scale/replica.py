"""One replica: a whole Omni server (orchestrator and its stage processes) in a Ray Serve replica.

The replica builds the app of ``sgl-omni serve`` (:func:`~sglang_omni.serve.app.create_app`) from
its :class:`~sglang_omni.scale.spec.ReplicaPlan`, runs its lifespan (the stages start before the
replica reports ready; a stage that fails to start fails the replica), and serves the requests
the gateway forwards (:meth:`OmniReplica.call`; WebSocket sessions :meth:`OmniReplica.websocket`)
through the app in-process, so routes, answers, streams and errors are the server's own.
``record_routing_stats`` is the routers' view of it (:mod:`~sglang_omni.scale.stats`);
``check_health`` fails, and Ray replaces the replica, only when the server cannot recover by
itself: a stage past its restart budget (``/health`` says
``unhealthy``) or a native stage whose exit stops the server. A stage restarting or stalled is
only reported (``health`` in the stats), and the routers pass the replica over meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from sglang_omni.errors import ConfigError
from sglang_omni.runtime.log_format import configure_logging
from sglang_omni.runtime.task_errors import log_failure
from sglang_omni.scale.asgi_call import (
    STREAM_END,
    Message,
    call_asgi,
    http_scope,
    run_asgi,
    websocket_receiver,
    websocket_scope,
    with_keepalive,
)
from sglang_omni.scale.call_fence import FenceClient
from sglang_omni.scale.spec import ReplicaPlan
from sglang_omni.scale.stats import ReplicaStats
from sglang_omni.serve.app import create_app
from sglang_omni.serve.chat.fleet_queue import WAITED_S_KEY
from sglang_omni.serve.direct.video_jobs import CALL_TAG, drop_jobs_of

log = logging.getLogger("sglang_omni.scale")
#: Client messages a relayed WebSocket session may hold before the gateway's next one waits.
MAX_INBOUND = 16
#: Seconds the replica's event loop may miss its one-second tick before it logs that it was
#: frozen (the gateway gives up on a call silent for 6 s).
FROZEN_LOG_S = 5.0


def _replica_identity() -> tuple[str, str | None]:
    """This replica's id and node, from Ray's replica context (outside Ray: ``local``)."""
    try:
        import ray
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id, ray.get_runtime_context(
        ).get_node_id()
    except Exception:  # noqa: BLE001 - not inside a Serve replica
        return "local", None


class OmniReplica:
    """A Serve deployment class; Ray constructs it with the replica plan."""

    async def __init__(self, plan: ReplicaPlan) -> None:  # type: ignore[misc]  # Serve awaits it
        try:
            config = plan.resolve()
        except ConfigError as exc:
            raise RuntimeError(f"configuration error on this replica: {exc}") from None
        source = plan.source
        configure_logging(source.log_level, source.log_format, role="replica")
        self.app = create_app(config, source.model_name, source.log_level,
                              log_format=source.log_format)
        self.orchestrator = self.app.state.orchestrator
        self.id, node = _replica_identity()
        self.stats = ReplicaStats(self.orchestrator, self.id, node)
        self._sessions: dict[str, asyncio.Queue[Message]] = {}  # relayed WebSocket sessions
        self._fence = FenceClient()
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = \
            self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self.stats.start_sampling()
        self._freeze_watch = asyncio.get_running_loop().create_task(_watch_freezes())
        self._freeze_watch.add_done_callback(log_failure(log, "the replica's freeze watch"))
        log.info("replica %s ready (pid stages: %s)", self.id, ", ".join(
            f"{n} {h.pid}" for n, h in self.orchestrator.stages.handles.items()))

    async def call(self, request: dict[str, Any], exclude: list[str] | None = None,
                   arrived_at: float | None = None, may_wait: bool = True,
                   replica: str | None = None, call_id: str | None = None,
                   fence: str | None = None, fence_namespace: str = "serve",
                   issued: float | None = None) -> AsyncIterator[str | list[Message]]:
        """Serve one forwarded request: yield this replica's id, then the app's ASGI messages
        in batches (:data:`~sglang_omni.scale.asgi_call.KEEPALIVE` after each second that
        brought none, so the gateway tells a slow answer from a frozen replica), then
        :data:`STREAM_END`. ``exclude``, ``may_wait`` and ``replica`` are for
        the router (replicas that refused it; whether it may wait for one; the replica it is
        pinned to), not used here; ``call_id`` (the gateway's id of this call) is listed in
        the routing stats while the call runs;
        ``arrived_at`` (wall clock) is when a planned request reached the gateway: its
        deadline counts from then (:mod:`~sglang_omni.serve.chat.fleet_queue`).
        ``fence`` (a call that changes state: the name of its gateway's fence actor, in
        ``fence_namespace``; ``issued``, the call's wall-clock time at the gateway): the call
        runs only if this replica claims it there before the gateway gave up on it
        (:mod:`~sglang_omni.scale.call_fence`); otherwise it ends with nothing."""
        path = request["path"]
        planned = arrived_at is not None
        if fence is not None and call_id is not None and not await self._fence.claim(
                fence, fence_namespace, call_id, time.time() if issued is None else issued):
            self.stats.fenced += 1
            log.warning("call %s (%s %s) not run: its gateway gave up on it (this replica did "
                        "not answer it in time) and asked another replica", call_id,
                        request["method"], path)
            return
        # claimed, before the first yield: the stats count it from now (a call they list is
        # one the app is about to take, so the planner's quote soon counts it too)
        self.stats.started(path, call_id, planned)
        scope = http_scope(request)
        if arrived_at is not None:
            scope[WAITED_S_KEY] = max(0.0, time.time() - float(arrived_at))
        settled = fence is None or call_id is None
        context = None
        if not settled:  # a job the app makes is tagged with the call: dropped if it never left
            context = contextvars.copy_context()
            context.run(CALL_TAG.set, call_id)
        answer = with_keepalive(call_asgi(self.app, scope, request["body"], context=context))
        try:
            yield self.id
            async for batch in answer:
                messages = batch if isinstance(batch, list) else []
                if not settled and any(m["type"] == "http.response.start" for m in messages):
                    assert fence is not None and call_id is not None
                    if not await self._fence.settle(fence, fence_namespace, call_id):
                        self.stats.fenced += 1
                        log.warning("call %s (%s %s) dropped: its gateway answered the client "
                                    "with an error while this replica did not answer (it was "
                                    "frozen after taking the call)", call_id,
                                    request["method"], path)
                        return
                    settled = True
                for message in messages:
                    if message["type"] == "http.response.start":
                        self.stats.answered(int(message["status"]))
                yield batch
            yield STREAM_END
        finally:
            await answer.aclose()
            if not settled and call_id is not None and (made := drop_jobs_of(call_id)):
                # its answer never left (dropped, or the gateway cancelled the call first)
                log.warning("call %s: %d video job(s) it made cancelled and deleted, its answer "
                            "having reached no client", call_id, made)
            self.stats.ended(path, call_id, planned)

    async def websocket(self, request: dict[str, Any], session: str
                        ) -> AsyncIterator[str | list[Message]]:
        """Serve one relayed WebSocket session: yield this replica's id (from then on the
        session takes the client's messages, :meth:`websocket_input`), then the messages the
        app sends, in batches, then :data:`STREAM_END`. Closing the stream is the client going
        away."""
        path = request["path"]
        inbound: asyncio.Queue[Message] = asyncio.Queue(MAX_INBOUND)
        self._sessions[session] = inbound
        self.stats.started(path)
        try:
            yield self.id
            async for batch in run_asgi(self.app, websocket_scope(request),
                                        websocket_receiver(inbound)):
                yield batch
            yield STREAM_END
        finally:
            self._sessions.pop(session, None)
            self.stats.ended(path)

    async def websocket_input(self, session: str, message: Message,
                              replica: str | None = None) -> bool:
        """Hand one client message to session ``session`` (waiting while the app is
        :data:`MAX_INBOUND` messages behind); False when this replica holds no such session.
        ``replica`` pins the call to this replica (the routers read it)."""
        inbound = self._sessions.get(session)
        if inbound is None:
            return False
        await inbound.put(message)
        return True

    def record_routing_stats(self) -> dict[str, Any]:
        return self.stats.snapshot()

    def check_health(self) -> None:
        """Raise (Ray replaces the replica) when the server cannot recover by itself."""
        if self.orchestrator.fatal_error is not None:
            raise RuntimeError(f"the server stopped: {self.orchestrator.fatal_error}")
        if self.orchestrator.health()["status"] == "unhealthy":
            raise RuntimeError("a stage exited for good (past its restart budget); /health "
                               "is unhealthy")

    async def __del__(self) -> None:
        """Stop the stages (Ray calls this on a graceful replica shutdown)."""
        lifespan, self._lifespan = getattr(self, "_lifespan", None), None
        if lifespan is None:
            return
        await self.stats.stop_sampling()
        watch = getattr(self, "_freeze_watch", None)
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        await lifespan.__aexit__(None, None, None)


async def _watch_freezes(clock: Callable[[], float] = time.monotonic) -> None:
    """Log each time this process was stopped or its event loop blocked for more than
    :data:`FROZEN_LOG_S` (SIGSTOP then SIGCONT, say), so the log names the cause of what
    follows: the gateway has failed the calls it held, and the stages, hearing nothing from
    this process, may have exited."""
    while True:
        before = clock()
        await asyncio.sleep(1.0)
        late = clock() - before - 1.0
        if late > FROZEN_LOG_S:
            log.warning("this replica was frozen for %.1f s (its process stopped or its event "
                        "loop blocked): the gateway failed the requests it was serving ('the "
                        "replica ... stopped answering') and passes it over; stage exits that "
                        "follow are the freeze's doing", late)
