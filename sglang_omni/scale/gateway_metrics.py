"""A fleet gateway's own metrics, appended to the fleet's ``/metrics`` (each sample labelled
``gateway="<Ray replica id>"``; the replicas' series carry ``replica``).

What only the gateway sees: the requests waiting in it for a replica that admits them (its
waiting room, ``--max-waiting``), the bodies it holds (``server.max_pending_body_bytes``), the
answers it asked of another replica (a 503 retried, a held result looked up elsewhere), the
requests it refused itself (a body over its budget, or too slow), and the requests whose replica
exited under them or stopped answering. With several gateways, a scrape reaches one of them:
its series only.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)

#: Why the gateway itself answered 503 or 408 (``sgl_omni_gateway_refusals_total``).
GATEWAY_REFUSALS = ("body_budget", "body_timeout")


class GatewayMetrics:
    """The gateway's metrics in a registry of their own; ``exposition()`` is their text."""

    def __init__(self, waiting: Callable[[], float], held_bytes: Callable[[], float]) -> None:
        disable_created_metrics()  # as the replicas: one sample set per metric
        self.registry = CollectorRegistry(auto_describe=True)
        Gauge("sgl_omni_gateway_waiting_requests", "requests waiting in this gateway for a "
              "replica whose plan admits them", registry=self.registry).set_function(waiting)
        Gauge("sgl_omni_gateway_pending_body_bytes", "request-body bytes this gateway holds "
              "until their answers end", registry=self.registry).set_function(held_bytes)
        self.retries = Counter("sgl_omni_gateway_retries", "answers not relayed but asked of "
                               "another replica, by the status that was held back (503: "
                               "admission refused; 404: a result another replica holds)",
                               ["status"], registry=self.registry)
        self.refusals = Counter("sgl_omni_gateway_refusals", "requests this gateway answered "
                                "itself before any replica saw them: body_budget (503, the "
                                "body did not fit beside those it holds), body_timeout (408)",
                                ["reason"], registry=self.registry)
        for reason in GATEWAY_REFUSALS:
            self.refusals.labels(reason=reason)
        self.replica_exits = Counter("sgl_omni_gateway_replica_exits", "requests whose replica "
                                     "exited while it served them (answered 500, or their "
                                     "stream ended with that error)", registry=self.registry)
        self.replica_silences = Counter(
            "sgl_omni_gateway_replica_silences", "requests failed because their replica "
            "stopped answering (nothing from it, not even its keep-alive, for the gateway's "
            "replica_silence_s: a frozen process or a blocked event loop)",
            registry=self.registry)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
