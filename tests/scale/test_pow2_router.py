"""``--router pow2`` (Ray's power of two choices) never sends a call to a replica it was told to
leave out (the call's ``exclude``, a replica found silent), and names the one replica it sends
to (no Ray cluster: Ray's router class itself, with replicas that answer its probes)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import (  # noqa: E402
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
)

from sglang_omni.scale import routed_calls, silent_replicas  # noqa: E402
from sglang_omni.scale.routers import PowerOfTwoRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="OmniReplica", app_name="omni")


def replica(key: str) -> Any:
    async def get_queue_len(deadline_s: float) -> int:
        return 0

    return SimpleNamespace(replica_id=ReplicaID(unique_id=key, deployment_id=DEPLOYMENT),
                           node_id="node", availability_zone=None, multiplexed_model_ids=set(),
                           max_ongoing_requests=8, routing_stats={},
                           get_queue_len=get_queue_len)


def call(n: int, **kwargs: Any) -> Any:
    context = SimpleNamespace(tried_same_node=False, tried_same_az=False, should_backoff=False,
                              tried_fewest_multiplexed_models=False,
                              tried_first_multiplexed_models=False)
    return SimpleNamespace(kwargs={"call_id": f"call-{n}", **kwargs}, routing_context=context,
                           metadata=SimpleNamespace(multiplexed_model_id="",
                                                    internal_request_id=f"request-{n}"))


def choices(replicas: list[Any], n: int = 30, **kwargs: Any) -> set[tuple[str, ...]]:
    """The groups the router answers for ``n`` calls (each a tuple of replica ids)."""
    async def run() -> set[tuple[str, ...]]:
        router = PowerOfTwoRouter(deployment_id=DEPLOYMENT,
                                  handle_source=DeploymentHandleSource.UNKNOWN)
        router.update_replicas(replicas)
        groups = [await router.choose_replicas(replicas, call(i, **kwargs)) for i in range(n)]
        return {tuple(r.replica_id.unique_id for r in g) for gs in groups for g in gs}

    return asyncio.run(run())


def test_a_retry_never_goes_back_to_the_replica_it_excludes() -> None:
    # Ray's own pow2 draws its pair from every replica it knows: the excluded one came back.
    assert choices([replica("a"), replica("b")], exclude=["a"]) == {("b",)}
    assert choices([replica("a"), replica("b"), replica("c")], exclude=["a", "b"]) == {("c",)}


def test_a_silent_replica_is_passed_over_and_each_call_names_one_replica() -> None:
    silent_replicas.mark("a")
    try:
        assert choices([replica("a"), replica("b"), replica("c")]) <= {("b",), ("c",)}
    finally:
        silent_replicas.answered("a")
    assert {len(group) for group in choices([replica("a"), replica("b")])} == {1}
    assert routed_calls.sent_to("call-0") is not None


def test_with_every_replica_excluded_it_still_sends_somewhere() -> None:
    assert choices([replica("a"), replica("b")], exclude=["a", "b"]) <= {("a",), ("b",)}
