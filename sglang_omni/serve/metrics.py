"""Prometheus metrics read from the orchestrator's live state at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from sglang_omni.pipeline.orchestrator import Orchestrator


class _StageCollector:
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("sgl_omni_stage_up", "1 when the stage process is ready",
                               labels=["stage"])
        jobs = CounterMetricFamily("sgl_omni_stage_jobs", "stage jobs by outcome",
                                   labels=["stage", "outcome"])
        restarts = CounterMetricFamily("sgl_omni_stage_restarts",
                                       "restarts of a stage process after it exited or stalled",
                                       labels=["stage"])
        stages = self.orchestrator.stages
        for name, handle in stages.handles.items():
            up.add_metric([name], 1.0 if handle.healthy else 0.0)
            c = handle.counters
            for outcome in ("submitted", "completed", "failed", "aborted", "dropped"):
                jobs.add_metric([name, outcome], float(getattr(c, outcome)))
            restarts.add_metric([name], float(stages.supervisors[name].restarts))
        yield up
        yield jobs
        yield restarts


def build_registry(orchestrator: Orchestrator) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StageCollector(orchestrator))
    return registry
