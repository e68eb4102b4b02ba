"""Simulate admission under overload: the generation planner against max_active alone.

Usage: PYTHONPATH=. python benchmarks/admission_sim.py [--seed 7] [--hours 8] [--timeouts 600,1800]

A discrete-event simulation (an injected clock, no sleeping) drives the real
``sglang_omni.pipeline.planner.GenerationPlanner`` with a minimal orchestrator loop: Poisson
arrivals at 1.5x and 3x the generation stage's capacity; each request's Reasoner decides on 0-8
generations (uniform), each an image or a video; Reasoner turns run concurrently; one generation
stage serves the oldest request first; the true generation times change by a step mid-run. The
baseline admits while fewer than ``max_active`` requests are active and starts the oldest queued
generation whenever the stage is free.

Columns: ``admitted``, ``refused`` (503 at admission), ``failfast`` (503 later, generation
cancelled), ``timeout`` (admitted but past its deadline), ``t/o held`` (of those, requests during
whose life no longer time was measured: the planner's guarantee), ``done`` (completed before the
deadline), ``w/ gen`` (of those, requests that ran at least one generation), ``short`` (of those,
answered with fewer generations than the Reasoner wanted), ``lowered`` (requests whose allowance
was lowered), ``receipts``, ``goodput/h`` (done per hour of arrivals), ``busy`` (the generation
stage's busy share of the run), ``wasted`` (the share of that spent on requests that did not
complete) and ``idle|queued`` (the stage's idle share of the time a generation was waiting).
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from dataclasses import dataclass, field

from sglang_omni.pipeline.planner import (
    Admit,
    Event,
    GenerationFinished,
    GenerationPlanner,
    GenerationQueued,
    GenerationStarted,
    PlannerConfig,
    PlanUpdate,
    Released,
    Tick,
    TurnEnded,
)

MODALITIES = ("image", "video")
TICK_AFTER_EXPIRY_S = 0.25  # the orchestrator's scheduler ticks every 0.25 s


@dataclass(frozen=True)
class Params:
    timeout_s: float = 600.0
    image_s: float = 20.0  # true times before the step; each draw is uniform in [(1-jitter)x, x]
    video_s: float = 60.0
    reasoner_s: float = 2.0
    jitter: float = 0.1
    reasoner_jitter: float = 0.5
    video_share: float = 0.5
    max_generations: int = 8
    max_active: int = 32
    hours: float = 8.0  # of arrivals; the run then drains
    step_at_h: float = 4.0
    step_factor: float = 1.5  # true generation times are multiplied by this from step_at_h on
    seed: int = 7

    def stage_seconds_per_request(self) -> float:
        """Mean generation-stage time one request needs, before the step."""
        mean_gens = self.max_generations / 2
        mean_gen = ((1 - self.video_share) * self.image_s + self.video_share * self.video_s)
        return mean_gens * mean_gen * (1 - self.jitter / 2)

    def capacity_per_h(self) -> float:
        return 3600.0 / self.stage_seconds_per_request()


@dataclass(frozen=True)
class Spec:
    """One request of the trace: when it arrives and what its Reasoner will do."""

    rid: str
    arrival: float
    wants: int
    modalities: tuple[str, ...]
    gen_factors: tuple[float, ...]
    turn_factors: tuple[float, ...]


def make_trace(params: Params, load: float, rng: random.Random) -> list[Spec]:
    rate = load * params.capacity_per_h() / 3600.0
    specs, t, n = [], 0.0, params.max_generations
    while True:
        t += rng.expovariate(rate)
        if t >= params.hours * 3600:
            return specs
        specs.append(Spec(
            rid=f"r{len(specs)}", arrival=t, wants=rng.randint(0, n),
            modalities=tuple("video" if rng.random() < params.video_share else "image"
                             for _ in range(n)),
            gen_factors=tuple(rng.uniform(1 - params.jitter, 1.0) for _ in range(n)),
            turn_factors=tuple(rng.uniform(1 - params.reasoner_jitter, 1.0)
                               for _ in range(2 * n + 1))))


class MaxActiveOnly:
    """The baseline, with the planner's interface: admit every request the max_active cap lets
    through (the simulation enforces the cap for both policies, as the orchestrator does)."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._used: dict[str, int] = {}
        self._queued: list[str] = []  # admission order is kept by sorting on admission index
        self._order: dict[str, int] = {}
        self._running: str | None = None

    def handle(self, event: Event) -> PlanUpdate:
        if isinstance(event, Admit):
            self._used[event.request_id] = 0
            self._order[event.request_id] = len(self._order)
        elif isinstance(event, GenerationQueued):
            self._used[event.request_id] += 1
            self._queued.append(event.request_id)
            self._queued.sort(key=self._order.__getitem__)
        elif isinstance(event, GenerationStarted):
            self._queued.remove(event.request_id)
            self._running = event.request_id
        elif isinstance(event, GenerationFinished):
            self._running = None
        elif isinstance(event, Released):
            rid = event.request_id
            self._used.pop(rid, None)
            if rid in self._queued:
                self._queued.remove(rid)
            if self._running == rid:
                self._running = None
        return PlanUpdate()

    def allowance(self, request_id: str) -> int:
        return self.config.max_generations - self._used[request_id]

    def next_generation(self) -> str | None:
        return None if self._running is not None or not self._queued else self._queued[0]


@dataclass
class Req:
    spec: Spec
    admitted_at: float = 0.0
    deadline: float = 0.0
    state: str = "new"  # reasoning, queued, generating, then an outcome
    outcome: str = ""  # completed, timeout, failfast, refused
    ended_at: float = 0.0
    gens_done: int = 0
    turns: int = 0
    offered: bool = False
    token: int = 0  # invalidates scheduled events of a cancelled turn or generation
    turn_started: float = 0.0
    gen_started: float = 0.0
    gen_modality: str = ""
    gen_duration: float = 0.0
    stage_s: float = 0.0  # generation-stage time this request used, cancelled work included


@dataclass
class Stats:
    arrived: int = 0
    admitted: int = 0
    refused: int = 0
    failfast: int = 0
    timeout: int = 0
    timeout_held: int = 0
    completed: int = 0
    completed_with_gen: int = 0  # of those, requests that ran at least one generation
    short: int = 0
    lowered: int = 0  # requests whose allowance was lowered at least once
    receipts: int = 0
    busy_s: float = 0.0
    wasted_s: float = 0.0  # stage time spent on requests that did not complete
    queued_s: float = 0.0
    idle_queued_s: float = 0.0
    end_s: float = 0.0
    lowered_ids: set[str] = field(default_factory=set)
    longer_at: list[float] = field(default_factory=list)


class Simulation:
    """One policy over one trace. ``self.now`` is the injected clock."""

    def __init__(self, params: Params, specs: list[Spec], use_planner: bool) -> None:
        self.params = params
        self.now = 0.0
        config = PlannerConfig(timeout_s=params.timeout_s, max_generations=params.max_generations)
        self.policy: GenerationPlanner | MaxActiveOnly = (
            GenerationPlanner(config, lambda: self.now) if use_planner else MaxActiveOnly(config))
        self.reqs = {s.rid: Req(s) for s in specs}
        self.events: list[tuple[float, bool, int, str, str, int]] = []
        self.seq = 0
        self.stage: str | None = None  # the request whose generation runs
        self.stats = Stats()
        self.ticks: set[float] = set()
        self.active = 0  # admitted requests without an outcome (the orchestrator's max_active)
        for s in specs:
            self.push(s.arrival, "arrive", s.rid)

    # --- plumbing --------------------------------------------------------------------------------
    def push(self, at: float, kind: str, rid: str = "", token: int = 0) -> None:
        self.seq += 1
        # A deadline comes after whatever else happens at the same instant.
        heapq.heappush(self.events, (at, kind == "deadline", self.seq, kind, rid, token))

    def handle(self, event: Event) -> PlanUpdate:
        update = self.policy.handle(event)
        if update.measured_longer:
            self.stats.longer_at.append(self.now)
        self.stats.lowered_ids.update(change.request_id for change in update.lowered)
        self.stats.receipts += update.receipt is not None
        for fail in update.failed:  # 503 now; cancel its generation
            req = self.reqs[fail.request_id]
            self.cancel_generation(req)
            self.finish(req, "failfast")
        # Tick just after a measurement leaves the window, as the scheduler's periodic tick would.
        expiry = self.now + self.params.timeout_s + TICK_AFTER_EXPIRY_S
        if isinstance(event, (TurnEnded, GenerationFinished)) and expiry not in self.ticks:
            self.ticks.add(expiry)
            self.push(expiry, "tick")
        return update

    def true_generation_s(self, req: Req, modality: str) -> float:
        p = self.params
        base = p.image_s if modality == "image" else p.video_s
        step = p.step_factor if self.now >= p.step_at_h * 3600 else 1.0
        return base * step * req.spec.gen_factors[req.gens_done]

    # --- the orchestrator loop -------------------------------------------------------------------
    def run(self) -> Stats:
        while self.events:
            at, _, _, kind, rid, token = heapq.heappop(self.events)
            if kind == "tick" and not self.active:
                continue  # the scheduler ticks only while requests are active
            self.account(at)
            self.now = at
            req = self.reqs.get(rid)
            if kind == "arrive":
                self.arrive(req)
            elif kind == "tick":
                self.handle(Tick())
            elif req.token != token or req.outcome:
                continue  # stale: the turn or generation was cancelled, or the request ended
            elif kind == "turn_end":
                self.turn_end(req)
            elif kind == "gen_end":
                self.gen_end(req)
            elif kind == "deadline":
                self.cancel_generation(req)
                self.finish(req, "timeout")
                self.handle(Released(req.spec.rid))
            self.dispatch()
        self.stats.end_s = self.now
        self.stats.wasted_s = sum(r.stage_s for r in self.reqs.values()
                                  if r.outcome != "completed")
        self.stats.lowered = len(self.stats.lowered_ids)
        return self.stats

    def arrive(self, req: Req) -> None:
        self.stats.arrived += 1
        if (self.active >= self.params.max_active
                or self.handle(Admit(req.spec.rid)).refused is not None):
            req.outcome = "refused"
            self.stats.refused += 1
            return
        self.stats.admitted += 1
        self.active += 1
        req.admitted_at, req.deadline = self.now, self.now + self.params.timeout_s
        self.push(req.deadline, "deadline", req.spec.rid, req.token)
        self.start_turn(req, self.policy.allowance(req.spec.rid))

    def start_turn(self, req: Req, allowance: int) -> None:
        req.state, req.offered, req.turn_started = "reasoning", allowance > 0, self.now
        took = self.params.reasoner_s * req.spec.turn_factors[min(req.turns, 16)]
        req.turns += 1
        self.push(self.now + took, "turn_end", req.spec.rid, req.token)

    def turn_end(self, req: Req) -> None:
        rid = req.spec.rid
        self.handle(TurnEnded(rid, self.now - req.turn_started))
        if req.outcome:
            return
        if req.offered and req.gens_done < req.spec.wants:
            modality = req.spec.modalities[req.gens_done]
            update = self.handle(GenerationQueued(rid, modality))
            if req.outcome:
                return
            if update.receipt is not None:
                self.start_turn(req, self.policy.allowance(rid))
            else:
                req.state, req.gen_modality = "queued", modality
            return
        self.finish(req, "completed")
        self.handle(Released(rid))

    def dispatch(self) -> None:
        while self.stage is None:
            rid = self.policy.next_generation()
            if rid is None:
                return
            req = self.reqs[rid]
            req.state, req.gen_started, self.stage = "generating", self.now, rid
            req.gen_duration = self.true_generation_s(req, req.gen_modality)
            self.push(self.now + req.gen_duration, "gen_end", rid, req.token)
            self.handle(GenerationStarted(rid))

    def gen_end(self, req: Req) -> None:
        self.stage = None
        req.stage_s += req.gen_duration
        rid = req.spec.rid
        self.handle(GenerationFinished(rid, req.gen_modality, req.gen_duration))
        req.gens_done += 1
        if req.outcome:
            return
        self.start_turn(req, self.policy.allowance(rid))

    def cancel_generation(self, req: Req) -> None:
        if req.state == "generating":
            self.stage = None
            req.stage_s += self.now - req.gen_started
        req.token += 1

    def finish(self, req: Req, outcome: str) -> None:
        req.outcome, req.state, req.ended_at = outcome, outcome, self.now
        self.active -= 1
        s = self.stats
        if outcome == "completed":
            s.completed += 1
            s.completed_with_gen += req.gens_done > 0
            s.short += req.gens_done < req.spec.wants
        elif outcome == "failfast":
            s.failfast += 1
        elif outcome == "timeout":
            s.timeout += 1
            if not any(req.admitted_at < t <= self.now for t in s.longer_at):
                s.timeout_held += 1

    def account(self, at: float) -> None:
        """Integrate the time a generation waited, and the part of it the stage was idle."""
        dt = at - self.now
        if self.stage is not None:
            self.stats.busy_s += dt
        if dt > 0 and any(r.state == "queued" for r in self.reqs.values() if not r.outcome):
            self.stats.queued_s += dt
            if self.stage is None:
                self.stats.idle_queued_s += dt


def run_table(params: Params) -> None:
    """Print one row per load and policy for ``params``."""
    header = (f"{'load':>5} {'policy':>10} {'arrived':>7} {'admitted':>8} {'refused':>7} "
              f"{'failfast':>8} {'timeout':>7} {'t/o held':>8} {'done':>5} {'w/ gen':>6} "
              f"{'short':>5} "
              f"{'lowered':>7} {'receipts':>8} {'goodput/h':>9} {'busy':>6} {'wasted':>6} "
              f"{'idle|queued':>11}")
    print(header)
    print("-" * len(header))
    for load in (1.5, 3.0):
        specs = make_trace(params, load, random.Random(params.seed * 1000 + int(load * 10)))
        for use_planner in (True, False):
            s = Simulation(params, specs, use_planner).run()
            idle = s.idle_queued_s / s.queued_s if s.queued_s else 0.0
            held = str(s.timeout_held) if use_planner else "-"
            print(f"{load:>4.1f}x {'planner' if use_planner else 'max_active':>10} "
                  f"{s.arrived:>7} {s.admitted:>8} {s.refused:>7} {s.failfast:>8} "
                  f"{s.timeout:>7} {held:>8} {s.completed:>5} {s.completed_with_gen:>6} "
                  f"{s.short:>5} {s.lowered:>7} "
                  f"{s.receipts:>8} {s.completed / params.hours:>9.1f} "
                  f"{s.busy_s / s.end_s:>6.1%} {s.wasted_s / s.busy_s:>6.1%} {idle:>11.2%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=Params.seed)
    parser.add_argument("--hours", type=float, default=Params.hours)
    parser.add_argument("--timeouts", default="600,1800",
                        help="comma-separated timeout_s values, one table each")
    args = parser.parse_args()
    started = time.perf_counter()
    for timeout in (float(t) for t in args.timeouts.split(",")):
        params = Params(seed=args.seed, hours=args.hours, timeout_s=timeout,
                        step_at_h=args.hours / 2)
        print(f"timeout_s {params.timeout_s:g}, max_generations {params.max_generations}, "
              f"max_active {params.max_active}, seed {params.seed}")
        print(f"true times: image {params.image_s:g} s, video {params.video_s:g} s (each draw "
              f"uniform in [{1 - params.jitter:g}x, 1x]), Reasoner turn {params.reasoner_s:g} s "
              f"([{1 - params.reasoner_jitter:g}x, 1x]); {params.video_share:.0%} videos; "
              "0-8 generations per request (uniform)")
        print(f"step: generation times x{params.step_factor:g} from hour {params.step_at_h:g} "
              f"of {params.hours:g} h of arrivals; capacity {params.capacity_per_h():.1f} "
              f"requests/h ({params.stage_seconds_per_request():.0f} s of generation each) "
              "before the step")
        run_table(params)
        print()
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
