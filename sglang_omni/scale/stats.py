"""A replica's routing stats: what its server would give a new request now, and its counters.

The replica returns :meth:`ReplicaStats.snapshot` from ``record_routing_stats``; Ray polls it
every ``request_routing_stats_period_s`` and hands it to the routers (``RunningReplica.
routing_stats``); ``sgl-omni replicas`` and the benchmark read it too. The keys:

``at`` (``time.time()`` of the snapshot), ``replica``, ``pid``, ``node``, ``gpus`` (the
replica's ``CUDA_VISIBLE_DEVICES``: the GPUs Ray gave it); ``health`` (the
``status`` of ``/health``: ``ok``, ``stalled``, ``restarting`` or ``unhealthy``) and ``stages``
(per stage: ``status``, ``pid``, ``restarts``, the job counters of ``/metrics`` and ``device``,
the ``CUDA_VISIBLE_DEVICES`` its process runs with; empty on the CPU);
``in_flight`` (model requests being served; the service paths of
:mod:`sglang_omni.serve.ops.service_paths` not counted), ``calls`` (the gateway's ids of the calls
the replica holds: a router knows from them which of its sends the stats count),
``planned_in_flight`` (requests in flight on a planned route: those the planner does not hold
yet are on their way to admission),
``stage_jobs`` (jobs its stages hold now: direct generation's video jobs run after their request
answered), ``max_active`` (the interleaved pipeline's ``max_active``, else None), ``quote`` (the
planner's
:class:`~sglang_omni.pipeline.planner_events.Quote` as a dict; None without a planner);
``answers`` (answered requests by status class: ``2xx``, ``4xx``, ``503``, ``5xx``), ``received``;
and for the generation stage ``busy_s`` (a generation ran), ``queued_s`` (one waited) and
``idle_queued_s`` (one waited and none ran), sampled every :data:`SAMPLE_S`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from sglang_omni.config.gpus import device_env
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.runtime.task_errors import log_failure
from sglang_omni.serve.ops.service_paths import is_service

log = logging.getLogger("sglang_omni.scale")

SAMPLE_S = 0.05


def status_class(status: int) -> str:
    if status == 503:
        return "503"
    return f"{status // 100}xx"


class ReplicaStats:
    """Counters of one replica's requests and its generation stage; use from its event loop."""

    def __init__(self, orchestrator: Orchestrator, replica: str, node: str | None = None) -> None:
        self.orchestrator = orchestrator
        self.replica = replica
        self.node = node
        self.in_flight = 0
        self.planned_in_flight = 0
        self.calls: set[str] = set()
        self.received = 0
        self.fenced = 0  # calls not run: their gateway had given up on them (call_fence)
        self.answers: Counter[str] = Counter()
        self.busy_s = self.queued_s = self.idle_queued_s = 0.0
        self._sampler: asyncio.Task[None] | None = None

    @staticmethod
    def counts(path: str) -> bool:
        """Whether a request to ``path`` is a model request (counted in ``in_flight``)."""
        return not is_service(path)

    def started(self, path: str, call_id: str | None = None, planned: bool = False) -> None:
        """A call arrived: ``call_id`` is the gateway's id of it; ``planned``, whether it is on a
        planned route (the gateway sent its arrival time)."""
        self.received += 1
        if call_id is not None:
            self.calls.add(call_id)
        if self.counts(path):
            self.in_flight += 1
            self.planned_in_flight += planned

    def answered(self, status: int) -> None:
        self.answers[status_class(status)] += 1

    def ended(self, path: str, call_id: str | None = None, planned: bool = False) -> None:
        """The call :meth:`started` with the same arguments ended."""
        self.calls.discard(call_id or "")
        if self.counts(path):
            self.in_flight -= 1
            self.planned_in_flight -= planned

    def snapshot(self) -> dict[str, Any]:
        orch = self.orchestrator
        health = orch.health()
        stages = {}
        for name, info in health["stages"].items():
            handle = orch.stages.handles[name]
            stages[name] = {**info, "jobs": asdict(handle.counters),
                            "device": device_env(handle.spec.gpu)}
        quote = None
        max_active = None
        if orch.controller is not None:
            quote = asdict(orch.scheduler.planner.quote())
            max_active = orch.max_active
        return {
            "at": time.time(), "replica": self.replica, "pid": os.getpid(), "node": self.node,
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "health": health["status"], "stages": stages, "in_flight": self.in_flight,
            "calls": sorted(self.calls), "planned_in_flight": self.planned_in_flight,
            "stage_jobs": sum(h.open_jobs for h in orch.stages.handles.values()),
            "max_active": max_active, "quote": quote, "answers": dict(self.answers),
            "received": self.received, "busy_s": self.busy_s, "queued_s": self.queued_s,
            "idle_queued_s": self.idle_queued_s, "fenced": self.fenced,
        }

    # --- the generation stage's busy and idle time ------------------------------------------
    def start_sampling(self) -> None:
        """Sample the plan's phases every SAMPLE_S (interleaved pipeline only)."""
        if self.orchestrator.controller is not None and self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
            self._sampler.add_done_callback(log_failure(log, "the replica's stage sampler"))

    async def stop_sampling(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
            self._sampler = None

    async def _sample(self) -> None:
        planner = self.orchestrator.scheduler.planner
        last = time.monotonic()
        while True:
            await asyncio.sleep(SAMPLE_S)
            now = time.monotonic()
            span, last = now - last, now
            phases = {p.phase for p in planner.plan()}
            if "generating" in phases:
                self.busy_s += span
            if "queued" in phases:
                self.queued_s += span
                if "generating" not in phases:
                    self.idle_queued_s += span
