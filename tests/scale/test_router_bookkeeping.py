"""The deadline router's count of what it sent each replica since its stats (no Ray cluster:
the router's hooks are called as Ray calls them)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from sglang_omni.scale.routers import DeadlineRouter  # noqa: E402


def replica(key: str, at: float) -> Any:
    """A replica whose stats, taken at ``at``, show nothing in flight (no planner)."""
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=key),
                           routing_stats={"at": at, "health": "ok", "in_flight": 0})


def call(rid: str, **kwargs: Any) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(internal_request_id=rid), kwargs=kwargs)


def first_choices(router: DeadlineRouter, replicas: list[Any], n: int = 20) -> set[str]:
    async def choose() -> str:
        order = await router.choose_replicas(replicas, None)
        return str(order[0][0].replica_id.unique_id)

    return {asyncio.run(choose()) for _ in range(n)}


def new_router() -> DeadlineRouter:
    router = DeadlineRouter.__new__(DeadlineRouter)  # Ray's constructor needs a deployment
    router.initialize_state(max_wait_s=0.0)
    return router


def test_a_websocket_session_counts_until_its_own_call_ends() -> None:
    router = new_router()
    replicas = [replica("r1", time.time() - 5), replica("r2", time.time() - 5)]
    r1 = replicas[0].replica_id
    router.on_request_routed(call("session"), r1, None)  # the session's call
    for _ in range(3):  # each client message is a call under the session's request id
        router.on_request_routed(call("session", replica="r1"), r1, None)
        router.on_request_completed(r1, "session")
    assert first_choices(router, replicas) == {"r2"}  # r1 still holds the session
    router.on_request_completed(r1, "session")
    assert first_choices(router, replicas) == {"r1", "r2"}


def test_a_request_retried_elsewhere_counts_on_its_new_replica() -> None:
    router = new_router()
    replicas = [replica("r1", time.time() - 5), replica("r2", time.time() - 5)]
    r1, r2 = (r.replica_id for r in replicas)
    router.on_request_routed(call("req"), r1, None)
    router.on_request_completed(r1, "req")  # answered 503
    router.on_request_routed(call("req", exclude=["r1"]), r2, None)  # the gateway's retry
    assert first_choices(router, replicas) == {"r1"}
