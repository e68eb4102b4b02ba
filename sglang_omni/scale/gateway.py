"""The fleet's HTTP entry: forwards each request to a replica, retrying a 503 on another.

Ray's HTTP proxy hands every request to a gateway replica (the Serve ingress), which reads the
body, asks the replicas' router for a replica and relays that replica's answer unchanged (status,
headers, every body chunk as it comes, so streams stream). Ray's proxy answers a request from the
first replica it reaches; the gateway is what can look at the answer first:

* a request on a planned route (:data:`PLANNED`) carries its arrival time (``arrived_at``): the
  deadline router may hold it until a replica admits it (``max_wait_s``), and the replica counts
  its deadline from that arrival (:mod:`~sglang_omni.serve.chat.fleet_queue`); at most
  ``max_waiting`` such requests wait at once (:class:`WaitingRoom`): beyond them a request is
  sent with ``may_wait=False``, so it is admitted now or refused with the replica's 503;
* a request on a planned route that reuses a client ``rid`` is sent to the replica that took
  that id (:mod:`~sglang_omni.scale.rid_pins`), which refuses it as one server would;
* a 503 (admission refused: the plan, ``max_active``, a restarting stage) is retried on another
  replica, up to ``retries`` times, the replicas that refused it passed to the router as
  ``exclude``; the last 503 reaches the client as it was;
* a 404 for a result a replica holds (direct generation's video jobs and stored images, by id:
  :data:`HELD_RESULT`) is asked of the other replicas in turn: the result lives on the replica
  that made it; ``GET /v1/videos`` lists every replica's jobs, and ``GET /metrics`` is every
  replica's metrics, each sample labelled with its replica, then the gateway's own
  (:mod:`~sglang_omni.scale.gateway_metrics`, labelled with the gateway); these fleet reads
  (and ``GET /v1/queue``, the first replica's answer) ask every replica at once and answer
  within ``fleet_read_s`` of reaching the gateway, naming the replicas that did not answer
  (:mod:`~sglang_omni.scale.fleet_answers`);
* a replica that dies (its process killed) before its answer started answers 500 with the error
  a stage death gives; after a stream started, the stream ends with that error (``event: error``
  on ``/generate``, an ``{"error": ...}`` chunk on chat) and ``[DONE]``, as on one server;
* a replica that stops answering (its process frozen, its event loop blocked) is found by its
  silence: a replica sends a keep-alive on every call each second its answer brings nothing
  (:data:`~sglang_omni.scale.asgi_call.KEEPALIVE`), so a call that brings nothing for
  ``replica_silence_s`` fails as a dead replica's does, naming the silence, and the replica is
  passed over by this process's routers from then on (:mod:`~sglang_omni.scale.silent_replicas`)
  long before Ray's health checks fail it; a call sent to a replica that never sends its first
  reply (it froze just then) is found the same way, counted from when the router sent it
  (:mod:`~sglang_omni.scale.routed_calls`: the deadline router's hold is not silence), and,
  as it never started, asked of another replica like a 503, that replica excluded; a call that
  changes state (not ``GET``/``HEAD``) is fenced first (:mod:`~sglang_omni.scale.call_fence`):
  it is asked elsewhere only if the gateway's give-up reached the fence before the replica's
  claim, so it never runs on both; otherwise the client gets the silence error at once;
* a client that disconnects cancels the replica's call: the replica's app sees the disconnect, and
  the request is aborted down to its generation stage.

The body is read here once (bounded by ``server.max_body_bytes``: a larger one is cut at one byte
over, which the replica refuses with 413, and the header check is the replica's; a body slower
than ``server.body_timeout_s`` is answered 408 here) and held until the relay ends, under a lease
on the gateway's ``server.max_pending_body_bytes`` (:mod:`~sglang_omni.serve.bodies.body_budget`): a
body that does not fit beside those the gateway holds is answered 503 here.

A WebSocket session is relayed to one replica for its whole life: the router picks it, the
replica runs the app's WebSocket route (:meth:`~sglang_omni.scale.replica.OmniReplica.websocket`),
the gateway relays what the app sends as it comes and hands each client message to that replica
in order (``websocket_input``, pinned by the routers to the session's replica). A client that
leaves is a ``websocket.disconnect`` to the app, which is then given :data:`GRACE_S` to end; a
replica that dies closes the session with 1011 and a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, cast

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import RequestCancelledError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from sglang_omni.aio.race import race
from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import (
    OmniError,
    RequestTooSlow,
    ServerError,
    ServiceUnavailable,
    StageDied,
)
from sglang_omni.scale import call_fence, fleet_members, routed_calls, silent_replicas
from sglang_omni.scale.asgi_call import (
    GRACE_S,
    KEEPALIVE,
    STREAM_END,
    Message,
    Receive,
    Scope,
    Send,
    StreamCut,
    forwarded,
)
from sglang_omni.scale.call_ids import own_id
from sglang_omni.scale.fleet_answers import (
    FleetAnswers,
    is_any_replica_read,
    is_fleet_listing,
    is_fleet_metrics,
    never,
)
from sglang_omni.scale.gateway_metrics import GatewayMetrics
from sglang_omni.scale.rid_pins import RidPins, client_rid, needs_thread
from sglang_omni.scale.silent_replicas import TAKEN, UNFENCED, ReplicaSilent
from sglang_omni.scale.waiting_room import WaitingRoom
from sglang_omni.serve.bodies.body_budget import BodyBudget, BodyLease
from sglang_omni.serve.wire.http_errors import GENERIC_500, error_response
from sglang_omni.serve.wire.sse import ERROR_DATA, ERROR_EVENT, failed_end

log = logging.getLogger("sglang_omni.scale")

#: Paths of results one replica holds (``GET``/``DELETE`` by id): a 404 is asked elsewhere.
HELD_RESULT = re.compile(r"^/v1/(videos|images)/[^/]+(/content)?/?$")
LOOKUP_METHODS = ("GET", "HEAD", "DELETE")
#: The routes the deadline plan admits: a request on one may wait for a replica that admits it.
PLANNED = re.compile(r"^/(generate|v1/chat/completions)/?$")
#: The close reason of a session whose replica died (a close reason holds at most 123 bytes).
SESSION_LOST = "the replica serving this session exited; Ray Serve is replacing it; reconnect"
REPLICA_DIED = ("the replica serving this request exited (its server process died) while the "
                "request was in flight; Ray Serve is replacing it; retry the request")
#: Seconds a fleet read (``/metrics``, ``GET /v1/videos``, ``/v1/queue``) takes at most in the
#: gateway, from its arrival to its answer, the replicas' answers waited for and merged: with the
#: proxy's hop the client has it within 2 s on a loaded host.
FLEET_READ_S = 1.2
#: Methods whose calls are not fenced: asking another replica cannot run anything twice.
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: Characters of a retried answer's body the gateway logs (its error message).
REFUSAL_LOGGED = 300
#: Seconds the gateway waits for its fence's answer before it takes the call as taken.
FENCE_TIMEOUT_S = 10.0
#: Seconds a replica's call may bring nothing (not even its keep-alive) before the gateway
#: takes the replica as frozen (its keep-alive comes every KEEPALIVE_S = 1 s).
REPLICA_SILENCE_S = 6.0


@dataclass(frozen=True)
class _Refused:
    """An answer not relayed (read to its end and dropped), or a call no replica answered
    (``replicas``: where it may have gone): another replica is asked."""

    replicas: tuple[str, ...]
    status: int
    #: The dropped answer's body, its first REFUSAL_LOGGED characters (its error message),
    #: for the retry's log line.
    detail: str = ""


def stream_failure(path: str, exc: OmniError) -> bytes:
    """The end of a stream that failed after it started, framed as the route frames errors."""
    framing = ERROR_EVENT if path.rstrip("/") == "/generate" else ERROR_DATA
    return failed_end(exc, framing).encode()


def is_sse(start: Message) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
               for k, v in start.get("headers", []))


class OmniGateway(FleetAnswers):
    """A Serve ingress deployment class (``serve.ingress()`` is applied by the builder)."""

    def __init__(self, replicas: DeploymentHandle, server: ServerSettings, retries: int,
                 replica_count: int, max_waiting: int = 256,
                 replica_silence_s: float = REPLICA_SILENCE_S,
                 fleet_read_s: float = FLEET_READ_S) -> None:
        self.replicas = replicas
        self.replica_silence_s = replica_silence_s
        self.fleet_read_s = fleet_read_s
        self.server = server
        self.retries = retries
        self.replica_count = replica_count
        self.waiting_room = WaitingRoom(max_waiting)
        self.rid_pins = RidPins()
        self.body_budget = BodyBudget(server.max_pending_body_bytes)
        self.metrics = GatewayMetrics(lambda: self.waiting_room.waiting,
                                      lambda: self.body_budget.held)
        self.body_budget.on_refused = \
            self.metrics.refusals.labels(reason="body_budget").inc
        self.name = _replica_id()
        self.fence_name = f"sgl-omni-fence-{self.name}"
        self.fence = call_fence.start(self.fence_name)

    def __serve_build_asgi_app__(self) -> Any:
        return _Asgi(self)

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        began = time.monotonic()  # a fleet read's bound counts from here
        with self.body_budget.lease() as lease:  # held until the relay ends (retries resend)
            try:
                body = await self._read_body(scope, receive, lease)
            except (RequestTooSlow, ServiceUnavailable) as exc:  # the budget counts its own
                if isinstance(exc, RequestTooSlow):
                    self.metrics.refusals.labels(reason="body_timeout").inc()
                await error_response(exc, self.server.retry_after_s)(scope, receive, send)
                return
            if body is None:
                return  # the client left before its body arrived
            await self._answer(scope, receive, send, body, began)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, body: bytes,
                      began: float) -> None:
        """Relay the request (its body read) to a replica, or to every replica for the fleet
        routes; a client that disconnects cancels the relay."""
        arrived_at = time.time() if (scope["method"] == "POST"
                                     and PLANNED.match(scope["path"])) else None
        rid = None
        if arrived_at is not None:
            limit = self.server.max_json_values
            rid = await asyncio.to_thread(client_rid, body, limit) if needs_thread(body) \
                else client_rid(body, limit)
        request = forwarded(scope, body)
        if is_fleet_listing(scope):
            answer = self._list_everywhere(scope, request, send, began)
        elif is_fleet_metrics(scope):
            answer = self._metrics_everywhere(request, send, began)
        elif is_any_replica_read(scope) and fleet_members.current():
            answer = self._first_answer(scope, request, send, began)
        else:
            answer = self._relay(scope, request, send, arrived_at, rid)
        await race(answer, _disconnected(receive))  # the relay's failure is raised

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay one WebSocket session to one replica (see the module docstring)."""
        session = uuid.uuid4().hex
        call = cast(DeploymentResponseGenerator, self.replicas.options(stream=True).websocket
                    .remote(forwarded(scope, b""), session))
        state = {"closed": False}
        relay: asyncio.Future[None] | None = None
        pump: asyncio.Future[bool] | None = None
        try:
            replica = await call.__anext__()
            relay = asyncio.ensure_future(_relay_session(call, send, state))
            pump = asyncio.ensure_future(self._pump(receive, session, replica))
            await asyncio.wait({relay, pump}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and pump.exception() is not None:
                raise cast(BaseException, pump.exception())
            if not relay.done() and pump.done() and pump.result():
                # the client left: the app was told, and has GRACE_S to end
                await asyncio.wait({relay}, timeout=GRACE_S)
            if relay.done() and relay.exception() is not None:
                raise cast(BaseException, relay.exception())
        except (asyncio.CancelledError, RequestCancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the session ends with a close frame
            lost = isinstance(exc, RayActorError | StreamCut)
            if lost:
                log.warning("WebSocket %s: %s", scope["path"], SESSION_LOST)
            else:
                log.error("WebSocket %s failed in the gateway", scope["path"], exc_info=exc)
            if not state["closed"]:
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": 1011,
                                "reason": SESSION_LOST if lost else "internal error"})
        finally:
            for task in (relay, pump):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (relay, pump) if t is not None),
                                 return_exceptions=True)
            call.cancel()

    async def _pump(self, receive: Receive, session: str, replica: str) -> bool:
        """Hand the client's messages to the session's replica in order; True once the client
        disconnected, False when the replica no longer holds the session."""
        while True:
            message = await receive()
            held = await self.replicas.websocket_input.remote(session, message, replica=replica)
            if message["type"] == "websocket.disconnect":
                return True
            if not held:
                return False

    async def _read_body(self, scope: Scope, receive: Receive, lease: BodyLease
                         ) -> bytes | None:
        """The body, at most ``max_body_bytes + 1`` bytes, covered by ``lease`` (503 when it
        does not fit beside the bodies this gateway holds); None if the client left."""
        limit = self.server.max_body_bytes
        declared = dict(scope.get("headers", [])).get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > limit:
            return b""  # the replica refuses it from the header (413)
        if declared.isdigit():
            lease.cover(int(declared))
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.server.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    chunks.append(chunk)
                    size += len(chunk)
                    lease.cover(min(size, limit + 1))
                    if size > limit or not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise RequestTooSlow(
                f"the request body did not arrive within {self.server.body_timeout_s:g} s "
                "(server.body_timeout_s); send it faster or raise the limit") from None

    def may_retry(self, scope: Scope, status: int, attempt: int) -> bool:
        """Whether answer ``status`` of attempt ``attempt`` (0 first) is asked elsewhere."""
        if status == 503:
            return attempt < self.retries
        return (status == 404 and scope["method"] in LOOKUP_METHODS
                and HELD_RESULT.match(scope["path"]) is not None
                and attempt < self.replica_count - 1)

    async def _relay(self, scope: Scope, request: dict[str, Any], send: Send,
                     arrived_at: float | None, rid: str | None = None) -> None:
        """Forward until a replica's answer is relayed; a request reusing a client ``rid`` goes
        first to the replica that took it."""
        tried: list[str] = []
        attempt = 0
        while True:
            pin = self.rid_pins.replica_for(rid) if rid is not None and not attempt else None
            refused = await self._attempt(scope, request, send, tried,
                                          partial(self.may_retry, scope, attempt=attempt),
                                          arrived_at, rid, pin)
            if refused is None:
                return
            log.info("replica %s answered %s %s with %d; asking another replica%s",
                     " or ".join(refused.replicas), scope["method"], scope["path"],
                     refused.status, f" (it said {refused.detail!r})"
                     if refused.detail else "")
            self.metrics.retries.labels(status=str(refused.status)).inc()
            tried.extend(refused.replicas)
            attempt += 1

    async def _attempt(self, scope: Scope, request: dict[str, Any], send: Send,
                       tried: list[str], may_retry: Callable[[int], bool],
                       arrived_at: float | None, rid: str | None = None,
                       pin: str | None = None) -> _Refused | None:
        """Forward to one replica and relay its answer; the answer held back when
        ``may_retry(status)``. ``arrived_at`` (planned routes only) lets the router hold the
        request until a replica admits it (while the waiting room has a place), and the replica
        count its deadline from then. ``rid`` (a client's) is pinned to the replica that takes
        it; ``pin`` sends the call to that replica."""
        kwargs: dict[str, Any] = {"exclude": list(tried), "call_id": uuid.uuid4().hex}
        fenced = scope["method"] not in SAFE_METHODS
        if fenced and self.fence is not None:
            kwargs.update(fence=self.fence_name, fence_namespace=self.fence[1],
                          issued=time.time())
        if pin is not None:
            kwargs["replica"] = pin
        waiting = False
        if arrived_at is not None:
            kwargs["arrived_at"] = arrived_at
            waiting = self.waiting_room.enter()
            if not waiting:
                kwargs["may_wait"] = False
        call = cast(DeploymentResponseGenerator, own_id(
            lambda: self.replicas.options(stream=True).call.remote(request, **kwargs)))
        started: Message | None = None
        held: _Refused | None = None
        replica: str | None = None
        fence = self._fenced(kwargs["call_id"]) if fenced else None
        silent_first: dict[str, bool] = {}

        async def first_silent() -> bool:
            """The call never brought its first item: whether to give up waiting (asked
            elsewhere, or failed) rather than wait on for an answer already released."""
            if not fenced:
                silent_first["retry"] = may_retry(503)
                return True
            if fence is None:
                return True
            if may_retry(503) and await self._gave_up(kwargs["call_id"]):
                silent_first["retry"] = True
                return True
            return await fence.abandon()

        try:
            try:
                replica = await routed_calls.first_item(call, kwargs["call_id"],
                                                        self.replica_silence_s, first_silent)
            except ReplicaSilent as exc:  # it never started: another replica is asked
                if not silent_first.get("retry"):
                    if not fenced or not may_retry(503):
                        raise
                    raise ReplicaSilent(exc.replica, self.replica_silence_s, exc.replicas,
                                        UNFENCED if self.fence is None else TAKEN) from None
                self.metrics.replica_silences.inc()
                log.warning("request %s %s: %s", scope["method"], scope["path"], exc)
                return _Refused(exc.replicas, 503)
            if waiting:
                waiting = False
                self.waiting_room.leave()
            if rid is not None:
                self.rid_pins.started(rid, replica)

            async def batch_silent() -> bool:
                """The call went silent after it started: whether to give up waiting (the
                client gets the silence error) rather than wait on for an answer released."""
                if started is not None or fence is None:
                    return True
                silent_first["dropped"] = await fence.abandon()
                return silent_first["dropped"]

            async for batch in self._batches(call, replica, batch_silent):
                for message in batch:
                    if started is None and message["type"] == "http.response.start":
                        started = message
                        if may_retry(message["status"]):
                            held = _Refused((replica,), message["status"])
                    if held is None:
                        await send(message)
                    elif message["type"] == "http.response.body" and \
                            len(held.detail) < REFUSAL_LOGGED:
                        body = bytes(message.get("body", b""))[:REFUSAL_LOGGED]
                        detail = held.detail + body.decode(errors="replace")
                        held = replace(held, detail=detail[:REFUSAL_LOGGED])
            return held
        except (asyncio.CancelledError, RequestCancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every answer ends well-formed
            if isinstance(exc, ReplicaSilent) and silent_first.get("dropped"):
                exc = ReplicaSilent(exc.replica, self.replica_silence_s, exc.replicas, TAKEN)
            await self._failed(scope, send, started if held is None else None, exc)
            return None
        finally:
            if waiting:
                self.waiting_room.leave()
            if rid is not None and replica is not None:
                status = started["status"] if started is not None else None
                self.rid_pins.ended(rid, replica, refused=status is None or status == 503
                                    or 400 <= status < 500)
            call.cancel()
            routed_calls.forget(kwargs["call_id"])

    async def _gave_up(self, call_id: str) -> bool:
        """Give up on a fenced call at this gateway's fence: True if no replica took it (and
        none will), so asking another replica cannot run it twice; False if one took it or the
        fence does not answer (:mod:`~sglang_omni.scale.call_fence`)."""
        if self.fence is None:
            return False
        try:
            async with asyncio.timeout(FENCE_TIMEOUT_S):
                return bool(await self.fence[0].give_up.remote(call_id))
        except Exception as exc:  # noqa: BLE001 - not known to be given up: not retried
            log.warning("the gateway's call fence did not answer (%s): call %s is not asked "
                        "of another replica", exc, call_id)
            return False

    def _fenced(self, call_id: str) -> _Abandon | None:
        """How a fenced call is abandoned at this gateway's fence (None without a fence)."""
        if self.fence is None:
            return None
        return _Abandon(self.fence[0], call_id)

    async def _batches(self, call: DeploymentResponseGenerator, replica: str,
                       on_silent: Callable[[], Awaitable[bool]] | None = None
                       ) -> AsyncIterator[list[Message]]:
        """The message batches of ``replica``'s call, up to its :data:`STREAM_END`; StreamCut
        when the stream stops before it, ReplicaSilent (and the replica marked silent) when
        nothing, not even a keep-alive, comes for ``replica_silence_s``, unless ``on_silent()``
        says False (the replica released its answer before it froze: it is waited for, as
        long as the replica lives)."""
        limit: float | None = self.replica_silence_s
        while True:
            try:
                async with asyncio.timeout(limit):
                    item = await call.__anext__()
            except StopAsyncIteration:
                raise StreamCut("the replica's stream stopped before its end") from None
            except TimeoutError:
                silent_replicas.mark(replica)
                if on_silent is None or await on_silent():
                    raise ReplicaSilent(replica, self.replica_silence_s) from None
                log.warning("replica %s is silent but had released its answer: waiting for "
                            "it", replica)
                limit = None
                continue
            if item == STREAM_END:
                return
            if item != KEEPALIVE:
                yield item

    async def _failed(self, scope: Scope, send: Send, started: Message | None,
                      exc: Exception) -> None:
        """End an answer whose replica call failed: an error answer, or the stream's end."""
        if isinstance(exc, ReplicaSilent):
            self.metrics.replica_silences.inc()
            error: OmniError = StageDied(str(exc))
            log.warning("request %s %s: %s", scope["method"], scope["path"], exc)
        elif isinstance(exc, RayActorError | StreamCut):
            self.metrics.replica_exits.inc()
            error = StageDied(REPLICA_DIED)
            log.warning("request %s %s: %s", scope["method"], scope["path"], REPLICA_DIED)
        else:
            error = ServerError(GENERIC_500)
            log.error("request %s %s failed in the gateway", scope["method"], scope["path"],
                      exc_info=exc)
        if started is None:
            await error_response(error, self.server.retry_after_s)(scope, never, send)
        elif is_sse(started):
            await send({"type": "http.response.body",
                        "body": stream_failure(scope["path"], error), "more_body": False})
        else:
            raise exc  # a plain body cut short: the connection is closed


@dataclass(frozen=True)
class _Abandon:
    """Abandon one fenced call at the gateway's fence (:mod:`~sglang_omni.scale.call_fence`)."""

    actor: Any
    call_id: str

    async def abandon(self) -> bool:
        """True if the replica will drop the call (the client is told the silence error);
        False if it released its answer first (the answer is on its way: wait for it). A fence
        that does not answer: True (the client is not kept waiting on a silent replica)."""
        try:
            async with asyncio.timeout(FENCE_TIMEOUT_S):
                return bool(await self.actor.abandon.remote(self.call_id))
        except Exception as exc:  # noqa: BLE001 - the client gets its error; logged
            log.warning("the gateway's call fence did not answer (%s): call %s may still run "
                        "on its replica when that replica resumes", exc, self.call_id)
            return True


def _replica_id() -> str:
    """This gateway's Ray replica id (``gateway`` outside a Serve replica)."""
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # noqa: BLE001 - not in a replica (a test builds the class directly)
        return "gateway"


class _Asgi:
    """The gateway as an ASGI 3 app (uvicorn takes a bound method for ASGI 2)."""

    def __init__(self, gateway: OmniGateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway.asgi(scope, receive, send)


async def _relay_session(call: DeploymentResponseGenerator, send: Send,
                         state: dict[str, bool]) -> None:
    """Send the client what the session's app sends; ``state["closed"]`` once it closed.
    StreamCut when the stream stops before its end."""
    async for batch in call:
        if batch == STREAM_END:
            return
        for message in batch:
            await send(message)
            if message["type"] == "websocket.close":
                state["closed"] = True
    raise StreamCut("the replica's stream stopped before its end")


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (after its body was read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
