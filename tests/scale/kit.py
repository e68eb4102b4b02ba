"""A local Ray cluster of two simulated nodes (2 GPUs each, Ray's fake GPU resources) with Serve
on a free port, and Omni fleets deployed on it with the scripted engines; each replica's
routing stats read from its actor. Imports Ray: use from tests that need the cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.cluster_utils import Cluster

from sglang_omni.config import parse_overrides
from sglang_omni.scale.builder import build
from sglang_omni.scale.fleet_answers import UNANSWERED_FIELD
from sglang_omni.scale.fleet_metrics import REPLICA_UP
from sglang_omni.scale.launch import replica_stats
from sglang_omni.scale.spec import ScaleOptions, ServerSource
from tests.server import free_port

ROOT = Path(__file__).parent.parent.parent
SCRIPTED = ROOT / "configs" / "cpu-scripted.yaml"
APP = "omni"
NODE_CPUS = 4
NODE_GPUS = 2
#: Both stages on (simulated) GPUs: each replica asks Ray for two, so one fits a node.
ON_GPUS = ("--generation.gpu", "0", "--reasoner.gpu", "1")
DEPLOY_TIMEOUT_S = 90.0
#: Seconds Serve's controller waits for its proxy's ready and health checks (Ray's default: 5
#: and 10 s, which a loaded machine's proxy can miss at its start).
PROXY_CHECK_S = 60.0


@dataclass
class RayCluster:
    cluster: Cluster
    url: str
    port: int

    @property
    def address(self) -> str:
        return str(self.cluster.address)


@contextmanager
def ray_cluster() -> Iterator[RayCluster]:
    """Two nodes (head and one more), Serve's proxy on a free port of 127.0.0.1, on the head
    node only.

    Both nodes run on this machine with one address, so a proxy on each would share the port
    (the kernel hands each new connection to either). Serve drains a proxy on a node that holds
    no replica and removes it about 30 s later: a test whose deployment took that long (a loaded
    machine) had its WebSocket connection handed to the proxy being removed, which closed it
    before answering. A cluster of real machines has an address per node, and a client picks
    its proxy.

    Serve's controller gives a starting proxy 5 s to say it is ready, then kills it as
    unhealthy; ``serve.start`` then fails with the proxy's ActorDiedError. On a loaded two-core
    machine a proxy's start takes longer, so the cluster's processes (they inherit this
    environment) get :data:`PROXY_CHECK_S` for that check and for the proxy's health checks."""
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, str(PROXY_CHECK_S))
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": NODE_CPUS, "num_gpus": NODE_GPUS})
    try:
        cluster.add_node(num_cpus=NODE_CPUS, num_gpus=NODE_GPUS)
        ray.init(address=cluster.address, namespace="serve", log_to_driver=False)
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        yield RayCluster(cluster, f"http://127.0.0.1:{port}", port)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


@dataclass
class Fleet:
    """An application deployed on the cluster: its URL and its replicas' routing stats."""

    url: str
    replicas: int

    def stats(self) -> list[dict[str, Any]]:
        return replica_stats(APP)

    def by_id(self) -> dict[str, dict[str, Any]]:
        return {s["replica"]: s for s in self.stats()}

    def wait(self, condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
        """Poll the stats until ``condition(stats list)`` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            value = condition(stats)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not met within {timeout} s: {stats}")
            time.sleep(0.1)


def deploy(cluster: RayCluster, *flags: str, replicas: int = 2, router: str = "deadline",
           retries: int | None = None, config: Path | None = SCRIPTED,
           text_only: bool = False, max_wait_s: float = 30.0,
           max_waiting: int = 256, health_check_s: float | None = None,
           **load_options: Any) -> Fleet:
    """Deploy (replacing the previous application) and wait until every replica is healthy and
    its stats reach the router (one stats period after they first answer). ``health_check_s``:
    Ray's health check period and timeout both (default: the builder's); ``load_options``:
    ``load_config``'s (``allowed_media_domain=[...]``, say)."""
    with_delete()
    source = ServerSource.from_file(config, parse_overrides(list(flags)), text_only=text_only,
                                    **load_options)
    checks = {} if health_check_s is None else {"health_check_period_s": health_check_s,
                                                "health_check_timeout_s": health_check_s}
    options = ScaleOptions(replicas=replicas, router=router, retries=retries,
                           max_wait_s=max_wait_s, max_waiting=max_waiting, **checks)
    serve.run(build(source, options), name=APP, route_prefix="/")
    fleet = Fleet(cluster.url, replicas)
    fleet.wait(lambda s: len(s) == replicas and all(r["health"] == "ok" for r in s),
               DEPLOY_TIMEOUT_S, f"{replicas} healthy replicas")
    settle(fleet)
    return fleet


def settle(fleet: Fleet) -> None:
    """Let the stats the replicas show now reach the gateway's router. Ray polls each replica's
    stats every stats period (0.5 s by default) and hands them to the router, whose copy no
    call can read: three periods (the one in progress, a poll, its delivery) is the one wait
    here that is not on an event the product exposes."""
    time.sleep(1.5)


def gateway_metric(fleet: Fleet, name: str, **labels: str) -> float:
    """A sample of the gateway's own metrics in the fleet's ``/metrics`` (0 when absent); its
    ``gateway`` label is not matched."""
    text = httpx.get(f"{fleet.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and "gateway" in sample.labels and all(
                    sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def whole_read(url: str, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
    """``GET path`` of a fleet read (``/v1/videos``, ``/metrics``) until every replica answered
    it: on a loaded machine a reply may miss the read's bound (``fleet_read_s``), and the read
    names that replica (``unanswered_replicas``, ``sgl_omni_gateway_replica_up`` 0); then it is
    taken again. The last answer after 30 reads either way."""
    for _ in range(30):
        resp = httpx.get(f"{url}{path}", params=params, timeout=60)
        if resp.status_code != 200 or not _lacks_a_replica(resp):
            break
    return resp


def _lacks_a_replica(resp: httpx.Response) -> bool:
    if resp.headers.get("content-type", "").startswith("application/json"):
        return bool(resp.json().get(UNANSWERED_FIELD))
    return any(sample.name == REPLICA_UP and sample.value == 0
               for family in text_string_to_metric_families(resp.text)
               for sample in family.samples)


def with_delete() -> None:
    """Delete the application if one runs (its replicas stop their stages)."""
    if APP in serve.status().applications:
        serve.delete(APP)


def post(url: str, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(url, json=body, timeout=timeout)
