"""The fleet's /metrics merge: every replica's samples, labelled, one group per family."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_omni.scale.fleet_metrics import GATEWAY_LABEL, labelled, merge, replica_up
from sglang_omni.scale.gateway_metrics import GatewayMetrics
from tests.metrics.kit import SCALING_OUT, table


def exposition(requests: int, active: float) -> str:
    registry = CollectorRegistry()
    counter = Counter("omni_requests_total", "requests", ["route"], registry=registry)
    counter.labels(route='/a "quoted"').inc(requests)
    Gauge("omni_active", "active", registry=registry).set(active)
    Histogram("omni_latency_seconds", "latency", buckets=(1.0,), registry=registry).observe(0.5)
    return generate_latest(registry).decode()


def test_labelled_puts_the_replica_first() -> None:
    assert labelled('x{a="1"} 2.0', "r1") == 'x{replica="r1",a="1"} 2.0'
    assert labelled("x 2.0", "r1") == 'x{replica="r1"} 2.0'
    assert labelled("x{} 2.0", "r1") == 'x{replica="r1"} 2.0'
    assert labelled("x 2.0", 'a"b') == 'x{replica="a\\"b"} 2.0'


def test_merge_is_one_valid_exposition_of_every_replica() -> None:
    text = merge([("r1", exposition(3, 1)), ("r2", exposition(5, 0))])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {(s.labels["replica"], s.labels["route"]): s.value
                for s in families["omni_requests"].samples if s.name == "omni_requests_total"}
    assert requests == {("r1", '/a "quoted"'): 3.0, ("r2", '/a "quoted"'): 5.0}
    active = {s.labels["replica"]: s.value for s in families["omni_active"].samples}
    assert active == {"r1": 1.0, "r2": 0.0}
    buckets = [s for s in families["omni_latency_seconds"].samples
               if s.name.endswith("_bucket")]
    assert {s.labels["replica"] for s in buckets} == {"r1", "r2"}
    # each family's header once, its samples together
    assert text.count("# TYPE omni_active gauge") == 1
    lines = text.splitlines()
    active_lines = [i for i, line in enumerate(lines) if line.startswith("omni_active{")]
    assert active_lines == list(range(active_lines[0], active_lines[0] + 2))


def test_merge_of_nothing_is_empty() -> None:
    assert merge([]) == ""


def test_the_gateway_series_follow_the_replicas_under_their_own_label() -> None:
    metrics = GatewayMetrics(lambda: 2, lambda: 300)
    metrics.retries.labels(status="503").inc()
    metrics.refusals.labels(reason="body_budget").inc()
    text = merge([("r1", exposition(1, 1))]) + merge([("g1", metrics.exposition())], "gateway")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    own = {s.name: (s.labels, s.value) for name, f in families.items()
           if name.startswith("sgl_omni_gateway_") for s in f.samples}
    assert own["sgl_omni_gateway_waiting_requests"] == ({"gateway": "g1"}, 2.0)
    assert own["sgl_omni_gateway_pending_body_bytes"] == ({"gateway": "g1"}, 300.0)
    assert own["sgl_omni_gateway_retries_total"] == ({"gateway": "g1", "status": "503"}, 1.0)
    assert own["sgl_omni_gateway_replica_exits_total"] == ({"gateway": "g1"}, 0.0)
    assert own["sgl_omni_gateway_replica_silences_total"] == ({"gateway": "g1"}, 0.0)
    refusals = {s.labels["reason"]: s.value for s in families["sgl_omni_gateway_refusals"].samples
                if s.name.endswith("_total")}
    assert refusals == {"body_budget": 1.0, "body_timeout": 0.0}


def test_the_scaling_out_page_documents_each_gateway_metric_as_exposed() -> None:
    metrics = GatewayMetrics(lambda: 0, lambda: 0)
    metrics.retries.labels(status="503").inc()
    exposed = {}
    for family in text_string_to_metric_families(metrics.exposition()):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels}
        exposed[name] = (family.type, tuple(sorted(labels)))
    for family in text_string_to_metric_families(replica_up("g", ["a"], ["b"])):
        labels = {k for s in family.samples for k in s.labels} - {GATEWAY_LABEL}
        exposed[family.name] = (family.type, tuple(sorted(labels)))
    documented = {name: (kind, tuple(sorted(labels)))
                  for name, (kind, labels) in table(SCALING_OUT).items()}
    assert documented == exposed
