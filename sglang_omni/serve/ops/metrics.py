"""Prometheus metrics (``sgl_omni_*``), one registry per app. ``docs/operations.md`` has the
table, and ``tests/metrics`` asserts every metric of it after a scripted workload.

Counters and histograms are updated as things happen: requests by the request recorder
(:mod:`.request_log`), Reasoner turns, generations and admission refusals by the orchestrator
(:class:`ServerMetrics` is its :class:`~sglang_omni.pipeline.observe.PipelineObserver`), stage
jobs by each stage handle. Gauges and stage counters are read from live state at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sglang_omni.media.stats import MEDIA_STATS, add_snapshots
from sglang_omni.pipeline.observe import REFUSAL_REASONS
from sglang_omni.serve.bodies.body_budget import BodyBudget
from sglang_omni.serve.ops.request_log import RequestRecord

if TYPE_CHECKING:
    from sglang_omni.pipeline.orchestrator import Orchestrator

#: Seconds: from a 5 ms refusal to an hour-long interleaved request.
LATENCY_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800,
                   3600)
STAGE_OUTCOMES = ("submitted", "started", "completed", "failed", "aborted", "dropped")


class ServerMetrics:
    """The metrics of one server; see the module docstring."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        disable_created_metrics()  # no ``*_created`` series: one sample set per metric
        self.orchestrator = orchestrator
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("sgl_omni_requests", "HTTP requests by route and final status "
                                "(a stream that failed: its error's code; a client that left: "
                                "nginx's client-closed status)", ["route", "status"], registry=r)
        self.latency = Histogram("sgl_omni_request_duration_seconds", "time to the end of the "
                                 "answer, by route", ["route"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.first_segment = Histogram("sgl_omni_time_to_first_segment_seconds", "interleaved "
                                       "requests: time until the first segment was sent",
                                       ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.active = Gauge("sgl_omni_active_requests", "HTTP requests being served "
                            "(/health, /metrics and static pages left out)", registry=r)
        self.turns = Histogram("sgl_omni_reasoner_turn_seconds", "interleaved Reasoner turns",
                               buckets=LATENCY_BUCKETS, registry=r)
        self.generations = Histogram("sgl_omni_generation_seconds", "interleaved generations "
                                     "on the generation stage, by modality", ["modality"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.spans = Histogram("sgl_omni_request_span_seconds", "interleaved requests: the "
                               "seconds of each request by span of its timeline (stage.span, "
                               "or server; see docs/interleaved.md)", ["span"],
                               buckets=LATENCY_BUCKETS, registry=r)
        self.refusals = Counter("sgl_omni_admission_refusals", "requests refused with 503 "
                                "before any work, or failed fast by the deadline plan, by "
                                "reason", ["reason"], registry=r)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason)
        self.pending_body = Gauge("sgl_omni_pending_body_bytes", "request-body bytes being "
                                  "read and parsed, all requests together", registry=r)
        self.finished_in_memory = Gauge(
            "sgl_omni_finished_requests_in_memory", "finished requests whose state or run is "
            "still in memory (each is freed as its exchange ends); 0 on a server at rest",
            registry=r)
        self.stage_jobs = Histogram("sgl_omni_stage_job_seconds", "stage jobs from submission "
                                    "to their end, by stage and outcome", ["stage", "outcome"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        for name, handle in orchestrator.stages.handles.items():
            handle.job_listeners.append(self._job_listener(name))
        r.register(_LiveCollector(orchestrator))

    def _job_listener(self, stage: str) -> Callable[[str, float], None]:
        def observe(outcome: str, seconds: float) -> None:
            self.stage_jobs.labels(stage, outcome).observe(seconds)

        return observe

    # --- the request recorder's sink ---------------------------------------------------------
    def in_flight(self, delta: int) -> None:
        self.active.inc(delta)

    def request_ended(self, route: str, record: RequestRecord, status: int,
                      duration_s: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(duration_s)
        if record.first_segment_s is not None:
            self.first_segment.labels(route).observe(record.first_segment_s)
        for span, seconds in (record.timeline(duration_s) or {}).items():
            self.spans.labels(span).observe(seconds)

    # --- the orchestrator's observer ---------------------------------------------------------
    def reasoner_turn(self, seconds: float) -> None:
        self.turns.observe(seconds)

    def generation(self, modality: str, seconds: float) -> None:
        self.generations.labels(modality).observe(seconds)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def watch_body_budget(self, budget: BodyBudget) -> None:
        """Expose ``budget``'s held bytes and count its refusals (reason ``body_budget``)."""
        self.pending_body.set_function(lambda: budget.held)
        budget.on_refused = lambda: self.refused("body_budget")

    def watch_finished(self, finished: Sized) -> None:
        """Expose how many finished requests are still in memory (``len(finished)``)."""
        self.finished_in_memory.set_function(lambda: len(finished))


class _LiveCollector:
    """What is read from live state at scrape time."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    def collect(self) -> Iterator[Metric]:
        yield from self._stages()
        yield from self._requests()
        yield from self._interleaved()
        yield from self._media()
        yield from self._contexts()

    def _stages(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("sgl_omni_stage_up", "1 when the stage process is ready",
                               labels=["stage"])
        jobs = CounterMetricFamily("sgl_omni_stage_jobs", "stage jobs by outcome",
                                   labels=["stage", "outcome"])
        sent = CounterMetricFamily("sgl_omni_stage_sent_bytes", "bytes of the jobs sent to the "
                                   "stage (each job's message header and media frames)",
                                   labels=["stage"])
        held = GaugeMetricFamily("sgl_omni_stage_request_media_bytes", "media bytes the stage "
                                 "keeps for its running requests (each item sent once per "
                                 "request, dropped at its end)", labels=["stage"])
        restarts = CounterMetricFamily("sgl_omni_stage_restarts",
                                       "restarts of a stage process after it exited or stalled",
                                       labels=["stage"])
        failed = CounterMetricFamily("sgl_omni_stage_failed_requests", "requests in flight "
                                     "that a stage's exit or stall failed (each once)",
                                     labels=["stage"])
        preemptions = CounterMetricFamily(
            "sgl_omni_generation_preemptions", "generations a generation stage paused at a "
            "denoising step boundary for an older request's", labels=["stage"])
        stages = self.orchestrator.stages
        for name, handle in stages.handles.items():
            up.add_metric([name], 1.0 if handle.healthy else 0.0)
            c = handle.counters
            for outcome in STAGE_OUTCOMES:
                jobs.add_metric([name, outcome], float(getattr(c, outcome)))
            restarts.add_metric([name], float(stages.supervisors[name].restarts))
            failed.add_metric([name], float(handle.failed_requests))
            sent.add_metric([name], float(c.sent_bytes))
            held.add_metric([name], float(handle.request_media.get("bytes", 0)))
            if handle.spec.role == "generation":
                preemptions.add_metric([name], float(handle.engine_stats().get("preemptions",
                                                                                0)))
        yield up
        yield jobs
        yield sent
        yield held
        yield restarts
        yield failed
        yield preemptions

    def _requests(self) -> Iterator[Metric]:
        states = GaugeMetricFamily("sgl_omni_request_states", "request states live in the "
                                   "orchestrator (a request id, an admission ticket, a run: "
                                   "pipeline.request_state); 0 on a server at rest")
        states.add_metric([], float(self.orchestrator.states.live))
        media = GaugeMetricFamily("sgl_omni_client_media_bytes", "client media bytes the "
                                  "running requests hold or reserved (server.max_client_media_"
                                  "bytes)")
        media.add_metric([], float(self.orchestrator.media_budget.held))
        yield states
        yield media

    def _interleaved(self) -> Iterator[Metric]:
        orch = self.orchestrator
        if orch.controller is None:
            return
        queued = GaugeMetricFamily("sgl_omni_queue_depth", "interleaved generations waiting "
                                   "for the generation stage")
        admitted = GaugeMetricFamily("sgl_omni_interleaved_requests", "interleaved requests "
                                     "admitted and running (at most max_active)")
        retained = GaugeMetricFamily("sgl_omni_retained_bytes", "host bytes the running "
                                     "interleaved requests hold (history and outputs)")
        longest = GaugeMetricFamily("sgl_omni_planner_longest_seconds", "the longest time the "
                                    "deadline planner measured (window: timeout_s), by kind",
                                    labels=["kind"])
        shortest = GaugeMetricFamily("sgl_omni_planner_shortest_seconds", "the shortest "
                                     "generation time the deadline planner measured, by kind",
                                     labels=["kind"])
        planner = orch.scheduler.planner
        queued.add_metric([], float(sum(1 for p in planner.plan() if p.phase == "queued")))
        admitted.add_metric([], float(orch.admitted))
        retained.add_metric([], float(sum(state.run.state.retained for state in orch.states
                                          if state.run is not None)))
        times = planner.times
        if times.reasoner_s is not None:
            longest.add_metric(["reasoner"], times.reasoner_s)
        for modality, seconds in sorted(times.longest_s.items()):
            longest.add_metric([modality], seconds)
        for modality, seconds in sorted(times.shortest_s.items()):
            shortest.add_metric([modality], seconds)
        yield from (queued, admitted, retained, longest, shortest)

    def _contexts(self) -> Iterator[Metric]:
        """The Reasoner stages' per-request contexts (hf backend; other backends keep none and
        report zeros)."""
        held = GaugeMetricFamily("sgl_omni_reasoner_context_bytes", "bytes the Reasoner "
                                 "stage keeps of its running requests' contexts", labels=["stage"])
        media = CounterMetricFamily("sgl_omni_reasoner_context_media", "media items of "
                                    "Reasoner turns found in the request's context (hit) or "
                                    "encoded (miss)", labels=["stage", "outcome"])
        evictions = CounterMetricFamily("sgl_omni_reasoner_context_evictions", "context "
                                        "entries evicted to stay within the byte budget",
                                        labels=["stage"])
        tokens = CounterMetricFamily("sgl_omni_reasoner_prompt_tokens", "Reasoner prompt "
                                     "tokens reused from the request's context or prefilled",
                                     labels=["stage", "source"])
        for name, handle in self.orchestrator.stages.handles.items():
            if handle.spec.role != "reasoner":
                continue
            stats = handle.engine_stats()
            held.add_metric([name], float(stats.get("bytes", 0)))
            media.add_metric([name, "hit"], float(stats.get("hits", 0)))
            media.add_metric([name, "miss"], float(stats.get("misses", 0)))
            evictions.add_metric([name], float(stats.get("evictions", 0)))
            tokens.add_metric([name, "reused"], float(stats.get("reused_tokens", 0)))
            tokens.add_metric([name, "prefilled"], float(stats.get("prefilled_tokens", 0)))
        yield from (held, media, evictions, tokens)

    def _media(self) -> Iterator[Metric]:
        snaps = [MEDIA_STATS.snapshot()]
        for handle in self.orchestrator.stages.handles.values():
            snaps.extend(handle.media_stats())
        total = add_snapshots(*snaps)
        fetches = CounterMetricFamily("sgl_omni_media_fetches", "remote media fetched (server "
                                      "and stage processes)")
        fetched = CounterMetricFamily("sgl_omni_media_fetched_bytes", "bytes of remote media "
                                      "fetched")
        refusals = CounterMetricFamily("sgl_omni_media_refusals", "media references refused or "
                                       "fetches failed, by reason", labels=["reason"])
        fetches.add_metric([], float(total["fetches"]))
        fetched.add_metric([], float(total["bytes"]))
        for reason, count in sorted(total["refusals"].items()):
            refusals.add_metric([reason], float(count))
        yield from (fetches, fetched, refusals)
