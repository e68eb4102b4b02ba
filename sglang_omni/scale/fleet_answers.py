"""The fleet-wide answers of the gateway: routes whose answer is every replica's
(``GET /v1/videos``, the jobs each replica holds; ``GET /metrics``, each replica's metrics
labelled by replica, then the gateway's own), asked of every replica at once. Each answers
within ``fleet_read_s`` of reaching the gateway (the replicas are waited for until
:data:`REPLY_S` before that: the merge and the answer's sending are inside the bound too) with
what the replicas that answered in time said, and names those that did not (the list's
``unanswered_replicas``; ``sgl_omni_gateway_replica_up`` 0), so a frozen replica neither holds
the read up nor vanishes from it unsaid."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.datastructures import QueryParams

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest, ServiceUnavailable
from sglang_omni.scale import fleet_members, silent_replicas
from sglang_omni.scale.asgi_call import Message, Scope, Send, StreamCut
from sglang_omni.scale.call_ids import own_id
from sglang_omni.scale.fleet_metrics import GATEWAY_LABEL, merge, replica_up
from sglang_omni.scale.gateway_metrics import GatewayMetrics
from sglang_omni.scale.silent_replicas import ReplicaSilent
from sglang_omni.serve.direct.video_listing import list_page, list_query
from sglang_omni.serve.wire.http_errors import error_response
from sglang_omni.serve.wire.responses import json_response

log = logging.getLogger("sglang_omni.scale")
#: The field of the fleet's ``GET /v1/videos`` naming the replicas whose jobs it lacks (they
#: did not answer within ``fleet_read_s``).
UNANSWERED_FIELD = "unanswered_replicas"
#: Seconds of a fleet read's ``fleet_read_s`` kept for merging the replicas' answers and sending
#: the fleet's: the replicas are waited for until then.
REPLY_S = 0.2
#: The least wait a replica is given, however late the read started (a loaded gateway).
MIN_WAIT_S = 0.05


def replica_wait(fleet_read_s: float, began: float) -> float:
    """Seconds a fleet read that reached the gateway at monotonic ``began`` may still wait for
    the replicas' answers: ``fleet_read_s`` from ``began``, less :data:`REPLY_S`."""
    return max(MIN_WAIT_S, fleet_read_s - REPLY_S - (time.monotonic() - began))


def is_fleet_listing(scope: Scope) -> bool:
    """Whether the request lists what every replica holds (``GET /v1/videos``)."""
    return scope["method"] == "GET" and scope["path"].rstrip("/") == "/v1/videos"


def is_any_replica_read(scope: Scope) -> bool:
    """Whether the request reads what any replica answers alike, bounded as the fleet reads
    (``GET /v1/queue``: one replica's plan)."""
    return scope["method"] == "GET" and scope["path"].rstrip("/") == "/v1/queue"


def is_fleet_metrics(scope: Scope) -> bool:
    """Whether the request reads every replica's metrics (``GET /metrics``)."""
    return scope["method"] == "GET" and scope["path"].rstrip("/") == "/metrics"


class FleetAnswers:
    """What the gateway answers for the whole fleet (a mixin of ``OmniGateway``, whose
    ``_batches`` reads a replica's call)."""

    replicas: DeploymentHandle
    replica_count: int
    server: ServerSettings
    name: str
    #: Seconds a fleet read waits for each replica's answer (the gateway's ``fleet_read_s``).
    fleet_read_s: float
    metrics: GatewayMetrics
    #: The message batches of a replica's call (``OmniGateway._batches``).
    _batches: Callable[[DeploymentResponseGenerator, str], AsyncIterator[list[Message]]]

    async def _every_replica(self, request: dict[str, Any], wait_s: float
                             ) -> tuple[list[tuple[str, Message, bytes]], list[str]]:
        """Every replica's answer to ``request`` as (replica, start message, body), and the
        replicas that did not answer within ``wait_s`` (or died meanwhile). Each replica
        the routers know of (:mod:`~sglang_omni.scale.fleet_members`) is asked at once, its call
        pinned to it, whether or not a call found it silent; one that answers is no longer
        passed over (:func:`~sglang_omni.scale.silent_replicas.answered`). Before the routers
        know the replicas (no call made yet) they are asked in turn, within the same bound."""
        members = fleet_members.current()
        if not members:
            return await self._every_replica_in_turn(request, wait_s)
        answers = await asyncio.gather(*(self._read_one(request, r, wait_s) for r in members))
        got = [a for a in answers if a is not None]
        return got, sorted(set(members) - {a[0] for a in got})

    async def _first_answer(self, scope: Scope, request: dict[str, Any], send: Send,
                            began: float) -> None:
        """The first whole answer any replica gives (every replica asked at once, the read
        answered within ``fleet_read_s`` of ``began``), so a frozen replica does not hold the
        read up; 503 when none answered in time."""
        wait_s = replica_wait(self.fleet_read_s, began)
        reads = [asyncio.ensure_future(self._read_one(request, r, wait_s))
                 for r in fleet_members.current()]
        try:
            for next_read in asyncio.as_completed(reads):
                got = await next_read
                if got is not None:
                    await send_answer(send, got[1], got[2])
                    return
        finally:
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
        await error_response(ServiceUnavailable(
            f"no replica answered within {self.fleet_read_s:g} s (fleet_read_s); retry"),
            self.server.retry_after_s)(scope, never, send)

    async def _read_one(self, request: dict[str, Any], replica: str, wait_s: float
                        ) -> tuple[str, Message, bytes] | None:
        """``replica``'s whole answer to ``request`` within ``wait_s``, or None."""
        call = cast(DeploymentResponseGenerator, own_id(
            lambda: self.replicas.options(stream=True).call.remote(request, replica=replica)))
        try:
            async with asyncio.timeout(wait_s):
                first = await call.__anext__()
                if first != replica:  # it is gone: the pin fell back to another replica
                    return None
                messages = [m async for batch in self._batches(call, replica) for m in batch]
        except (TimeoutError, RayActorError, StreamCut, ReplicaSilent, StopAsyncIteration):
            log.warning("replica %s did not answer %s %s within %g s; its answer is left out",
                        replica, request["method"], request["path"], wait_s)
            return None
        finally:
            call.cancel()
        silent_replicas.answered(replica)
        return replica, *_whole(messages)

    async def _every_replica_in_turn(self, request: dict[str, Any], wait_s: float
                                     ) -> tuple[list[tuple[str, Message, bytes]], list[str]]:
        """The replicas' answers asked in turn through the router (each call excluding those
        already asked) until one repeats or all answered, within ``wait_s`` in all."""
        tried: list[str] = []
        answers: list[tuple[str, Message, bytes]] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                for _ in range(self.replica_count):
                    call = cast(DeploymentResponseGenerator, own_id(
                        lambda: self.replicas.options(stream=True).call.remote(
                            request, exclude=list(tried))))
                    try:
                        replica = await call.__anext__()
                        messages = [m async for batch in self._batches(call, replica)
                                    for m in batch]
                    except (RayActorError, StreamCut, ReplicaSilent):
                        continue
                    finally:
                        call.cancel()
                    if replica in tried:
                        break
                    tried.append(replica)
                    answers.append((replica, *_whole(messages)))
        return answers, sorted(set(fleet_members.current()) - set(tried))

    async def _list_everywhere(self, scope: Scope, request: dict[str, Any], send: Send,
                               began: float) -> None:
        """``GET /v1/videos`` of the fleet: the page of every replica's jobs the query selects
        (each replica is asked for all of its jobs: a page of one is no page of the fleet's); an
        answer other than 200 is relayed as it is."""
        jobs: list[dict[str, Any]] = []
        answers, unanswered = await self._every_replica(
            {**request, "query_string": b""}, replica_wait(self.fleet_read_s, began))
        for _, start, body in answers:
            if start["status"] != 200:  # a refused API key, say: as one server answers
                await send_answer(send, start, body)
                return
            jobs.extend(json.loads(body)["data"])
        try:  # after the replicas' answers, as one server checks the key before the query
            query = list_query(QueryParams(scope.get("query_string", b"")))
        except BadRequest as exc:
            await error_response(exc, self.server.retry_after_s)(scope, never, send)
            return
        page = list_page(jobs, query)
        page[UNANSWERED_FIELD] = unanswered
        await json_response(page)(scope, never, send)

    async def _metrics_everywhere(self, request: dict[str, Any], send: Send, began: float
                                  ) -> None:
        """``GET /metrics`` of the fleet: every replica's metrics, labelled by replica
        (:mod:`~sglang_omni.scale.fleet_metrics`), then this gateway's, labelled by gateway;
        an answer other than 200 is relayed."""
        texts: list[tuple[str, str]] = []
        content_type = b"text/plain; version=0.0.4; charset=utf-8"
        answers, unanswered = await self._every_replica(
            request, replica_wait(self.fleet_read_s, began))
        for replica, start, body in answers:
            if start["status"] != 200:
                await send_answer(send, start, body)
                return
            content_type = dict(start.get("headers", [])).get(b"content-type", content_type)
            texts.append((replica, body.decode("utf-8", "replace")))
        up = replica_up(self.name, [r for r, _ in texts], unanswered)
        merged = (merge(texts) + merge([(self.name, self.metrics.exposition())],
                                       GATEWAY_LABEL) + up).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(merged)).encode())]})
        await send({"type": "http.response.body", "body": merged, "more_body": False})


def _whole(messages: list[Message]) -> tuple[Message, bytes]:
    """An answer's start message and its whole body."""
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start, body


async def send_answer(send: Send, start: Message, body: bytes) -> None:
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")
