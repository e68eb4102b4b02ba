"""The deadline router's count of what it sent each replica since its stats (no Ray cluster:
the router's hooks are called as Ray calls them)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from sglang_omni.scale import routers  # noqa: E402
from sglang_omni.scale.routers import DeadlineRouter  # noqa: E402


def replica(key: str, at: float, calls: list[str] | None = None) -> Any:
    """A replica whose stats, taken at ``at``, show ``calls`` in flight (none by default; no
    planner); without ``calls``, stats that list no call ids."""
    stats: dict[str, Any] = {"at": at, "health": "ok", "in_flight": len(calls or ())}
    if calls is not None:
        stats["calls"] = calls
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=key), routing_stats=stats)


def call(rid: str, *args: Any, **kwargs: Any) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(internal_request_id=rid), args=args,
                           kwargs=kwargs)


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


def test_a_call_counts_until_the_replica_lists_it_however_late_it_arrives() -> None:
    """A call that took longer to reach its replica than the stats took to refresh is still
    counted by the router (a loaded machine: the fixed transit allowance is not enough)."""
    router = new_router()
    a, b = replica("a", time.time() - 5, calls=[]), replica("b", time.time() - 5, calls=[])
    router.on_request_routed(call("req", call_id="c1"), a.replica_id, None)
    for r in (a, b):  # stats recorded well after the send, without the call yet
        r.routing_stats["at"] = time.time() + 1
    assert first_choices(router, [a, b]) == {"b"}
    a.routing_stats.update(calls=["c1"], in_flight=1)  # there now: the stats count it
    assert first_choices(router, [a, b]) == {"b"}
    router.on_request_completed(a.replica_id, "req")  # ended, still in the stats: given back
    assert first_choices(router, [a, b]) == {"a", "b"}
    a.routing_stats.update(calls=[], in_flight=0)  # and forgotten once the stats drop it
    assert first_choices(router, [a, b]) == {"a", "b"}
    assert router._calls["a"] == {}


def test_a_call_the_stats_listed_and_dropped_is_forgotten_though_its_end_never_came() -> None:
    """Ray does not report every call's completion: a call the replica listed and no longer
    lists has ended there, and must not hold the replica's place for good."""
    router = new_router()
    a, b = replica("a", time.time(), calls=["c1"]), replica("b", time.time(), calls=[])
    router.on_request_routed(call("req", call_id="c1"), a.replica_id, None)
    assert first_choices(router, [a, b]) == {"b"}  # listed: the stats count it
    a.routing_stats.update(calls=[], in_flight=0, at=time.time())  # over; no completion came
    assert first_choices(router, [a, b]) == {"a", "b"}


def test_the_router_answers_one_replica_the_excluded_ones_left_out() -> None:
    # Given more groups, Ray falls through to the next when it cannot probe the first in time,
    # sending the call somewhere the gateway's note does not name: one replica, or none.
    router = new_router()
    now = time.time()
    replicas = [replica(k, now) for k in ("r1", "r2", "r3")]
    for _ in range(10):
        pending = call("req", exclude=["r1"])
        pending.routing_context = SimpleNamespace(should_backoff=False)
        order = asyncio.run(router.choose_replicas(replicas, pending))
        assert len(order) == 1 and len(order[0]) == 1
        assert order[0][0].replica_id.unique_id in ("r2", "r3")


@pytest.mark.parametrize("path", ["/metrics", "/health", "/v1/queue"])
@pytest.mark.parametrize("call_id", [None, "read-1"])
def test_a_read_the_stats_never_counted_does_not_free_a_full_replica(
        path: str, call_id: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet read (the gateway's /metrics asks every replica) is not a model request: the
    replica's ``in_flight`` never counts it. Its end must not give back a model request's place
    (fails before the fix: a Prometheus scrape, or a test's, that was in flight when a full
    replica's stats were recorded and ended after made that replica look free, and a held
    request was sent there and refused 503)."""
    clock = [time.time()]
    monkeypatch.setattr(routers, "time", SimpleNamespace(time=lambda: clock[0]))
    router = new_router()
    recorded = clock[0]
    full, half = replica("full", recorded, calls=["long"]), replica("half", recorded,
                                                                   calls=["other"])
    full.routing_stats["max_active"] = 1  # its one place is taken by the long call
    half.routing_stats["max_active"] = 2  # one of two taken
    router.on_request_routed(call("long-req", call_id="long"), full.replica_id, None)
    router.on_request_routed(call("other-req", call_id="other"), half.replica_id, None)
    kwargs = {"replica": "full"} if call_id is None else {"call_id": call_id}
    if call_id is not None:  # a relayed read: the replica lists it, its in_flight does not
        full.routing_stats["calls"] = ["long", call_id]
    clock[0] = recorded - 1  # the read was sent well before the stats were recorded
    read = call("read", {"method": "GET", "path": path, "body": b""}, **kwargs)
    router.on_request_routed(read, full.replica_id, None)
    clock[0] = recorded + 0.5  # and ended after
    router.on_request_completed(full.replica_id, "read")
    assert first_choices(router, [full, half]) == {"half"}
