"""The fleet-wide answers of the gateway: routes whose answer is every replica's
(``GET /v1/videos``, the jobs each replica holds; ``GET /metrics``, each replica's metrics
labelled by replica, then the gateway's own), asked of the replicas in turn."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.datastructures import QueryParams

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.scale.asgi_call import Message, Scope, Send, StreamCut
from sglang_omni.scale.fleet_metrics import GATEWAY_LABEL, merge
from sglang_omni.scale.gateway_metrics import GatewayMetrics
from sglang_omni.scale.silent_replicas import ReplicaSilent
from sglang_omni.serve.direct.video_listing import list_page, list_query
from sglang_omni.serve.wire.http_errors import error_response
from sglang_omni.serve.wire.responses import json_response

log = logging.getLogger("sglang_omni.scale")


def is_fleet_listing(scope: Scope) -> bool:
    """Whether the request lists what every replica holds (``GET /v1/videos``)."""
    return scope["method"] == "GET" and scope["path"].rstrip("/") == "/v1/videos"


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
    metrics: GatewayMetrics
    #: The message batches of a replica's call (``OmniGateway._batches``).
    _batches: Callable[[DeploymentResponseGenerator, str], AsyncIterator[list[Message]]]

    async def _every_replica(self, request: dict[str, Any]
                             ) -> list[tuple[str, Message, bytes]]:
        """Every replica's answer to ``request`` as (replica, start message, body): replicas
        are asked in turn (each call excluding those already asked) until one repeats or all
        answered; a replica that dies is left out."""
        tried: list[str] = []
        answers: list[tuple[str, Message, bytes]] = []
        for _ in range(self.replica_count):
            call = cast(DeploymentResponseGenerator, self.replicas.options(stream=True).call
                        .remote(request, exclude=list(tried)))
            try:
                replica = await call.__anext__()
                messages = [m async for batch in self._batches(call, replica) for m in batch]
            except (RayActorError, StreamCut, ReplicaSilent):
                log.warning("a replica exited while %s %s asked every replica; its answer is "
                            "left out", request["method"], request["path"])
                continue
            finally:
                call.cancel()
            if replica in tried:
                break
            tried.append(replica)
            start = next(m for m in messages if m["type"] == "http.response.start")
            body = b"".join(m.get("body", b"") for m in messages
                            if m["type"] == "http.response.body")
            answers.append((replica, start, body))
        return answers

    async def _list_everywhere(self, scope: Scope, request: dict[str, Any], send: Send
                               ) -> None:
        """``GET /v1/videos`` of the fleet: the page of every replica's jobs the query selects
        (each replica is asked for all of its jobs: a page of one is no page of the fleet's); an
        answer other than 200 is relayed as it is."""
        jobs: list[dict[str, Any]] = []
        for _, start, body in await self._every_replica({**request, "query_string": b""}):
            if start["status"] != 200:  # a refused API key, say: as one server answers
                await send_answer(send, start, body)
                return
            jobs.extend(json.loads(body)["data"])
        try:  # after the replicas' answers, as one server checks the key before the query
            query = list_query(QueryParams(scope.get("query_string", b"")))
        except BadRequest as exc:
            await error_response(exc, self.server.retry_after_s)(scope, never, send)
            return
        await json_response(list_page(jobs, query))(scope, never, send)

    async def _metrics_everywhere(self, request: dict[str, Any], send: Send
                                  ) -> None:
        """``GET /metrics`` of the fleet: every replica's metrics, labelled by replica
        (:mod:`~sglang_omni.scale.fleet_metrics`), then this gateway's, labelled by gateway;
        an answer other than 200 is relayed."""
        texts: list[tuple[str, str]] = []
        content_type = b"text/plain; version=0.0.4; charset=utf-8"
        for replica, start, body in await self._every_replica(request):
            if start["status"] != 200:
                await send_answer(send, start, body)
                return
            content_type = dict(start.get("headers", [])).get(b"content-type", content_type)
            texts.append((replica, body.decode("utf-8", "replace")))
        merged = (merge(texts) + merge([(self.name, self.metrics.exposition())],
                                       GATEWAY_LABEL)).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(merged)).encode())]})
        await send({"type": "http.response.body", "body": merged, "more_body": False})


async def send_answer(send: Send, start: Message, body: bytes) -> None:
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")
