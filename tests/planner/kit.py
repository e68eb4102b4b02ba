"""Helpers for the planner tests: a settable clock, measurements, and a small orchestrator loop."""

from __future__ import annotations

import heapq
from collections.abc import Callable
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

GHOST = "ghost"  # measurements under an id the planner does not track are recorded all the same
TICK_AFTER_EXPIRY_S = 0.25  # the scheduler ticks every 0.25 s (scheduling.TICK_S)


class Clock:
    """A clock the test sets by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(timeout_s: float = 100.0, max_generations: int = 2
         ) -> tuple[GenerationPlanner, Clock]:
    clock = Clock()
    config = PlannerConfig(timeout_s=timeout_s, max_generations=max_generations)
    return GenerationPlanner(config, clock), clock


def measure(planner: GenerationPlanner, reasoner: float | None = None,
            **generations: float) -> PlanUpdate | None:
    """Record measurements at the planner's current time; returns the last update."""
    update = None
    if reasoner is not None:
        update = planner.handle(TurnEnded(GHOST, reasoner))
    for modality, seconds in generations.items():
        update = planner.handle(GenerationFinished(GHOST, modality, seconds))
    return update


def allowances(planner: GenerationPlanner) -> dict[str, int]:
    return {p.request_id: p.allowance for p in planner.plan()}


# --- a small orchestrator loop for the property tests ---------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """A request of a trace: arrives ``gap`` s after the previous one; its Reasoner wants
    ``wants`` generations of ``modalities``; its turns and generations take these durations."""

    gap: float
    wants: int
    modalities: tuple[str, ...]
    turn_s: tuple[float, ...]
    gen_s: tuple[float, ...]


@dataclass
class Outcome:
    admitted: bool = False
    admitted_at: float = 0.0
    deadline: float = 0.0
    status: str = ""  # completed, timeout, failfast, refused
    ended_at: float = 0.0
    gens_done: int = 0
    turns: int = 0
    offered: bool = False
    state: str = ""
    token: int = 0
    turn_started: float = 0.0
    modality: str = ""
    gen_s: float = 0.0
    gen_started: float = 0.0


@dataclass
class Run:
    outcomes: dict[str, Outcome]
    updates: list[PlanUpdate] = field(default_factory=list)
    longer_at: list[float] = field(default_factory=list)

    def held(self, rid: str) -> bool:
        """No longer time was measured, nor cut short after overrunning, in the request's life."""
        o = self.outcomes[rid]
        return not any(o.admitted_at <= t <= o.ended_at for t in self.longer_at)


def drive(planner: GenerationPlanner, clock: Clock, arrivals: list[Arrival],
          check: Callable[[GenerationPlanner], None] | None = None,
          max_active: int | None = None) -> Run:
    """Run ``arrivals`` through ``planner`` with a one-generation-at-a-time stage.

    The loop follows the planner's contract: it offers each turn what the planner allows,
    dispatches only what ``next_generation`` names, answers receipts, fails fast-failed
    requests, and times requests out at their deadline. Like the orchestrator it refuses an
    arrival without asking the planner while ``max_active`` requests are planned. It ticks
    just after each measurement leaves the window (as the scheduler's periodic tick would).
    ``check`` runs after every event.
    """
    timeout = planner.config.timeout_s
    events: list[tuple[float, bool, int, str, str, int]] = []
    seq = 0
    outcomes = {f"r{i}": Outcome() for i in range(len(arrivals))}
    specs = {f"r{i}": a for i, a in enumerate(arrivals)}
    run = Run(outcomes)
    stage: list[str | None] = [None]
    ticks: set[float] = set()

    def push(at: float, kind: str, rid: str = "", token: int = 0) -> None:
        nonlocal seq
        seq += 1
        # A deadline comes after whatever else happens at the same instant: ending at the
        # deadline is in time.
        heapq.heappush(events, (at, kind == "deadline", seq, kind, rid, token))

    def cancel(o: Outcome) -> None:
        # A turn or generation cut short after running longer than the planner's times did not
        # hold those times, although it measured nothing: count it as a longer time.
        times = planner.times
        if o.state == "generating":
            stage[0] = None
            known = times.generation_s is not None
            if not known or clock.now - o.gen_started > times.longest(o.modality):
                run.longer_at.append(clock.now)
        elif o.state == "reasoning" and clock.now - o.turn_started > times.reasoner:
            run.longer_at.append(clock.now)
        o.token += 1

    def end(rid: str, status: str) -> None:
        o = outcomes[rid]
        o.status, o.state, o.ended_at = status, status, clock.now

    def handle(event: Event) -> PlanUpdate:
        update = planner.handle(event)
        run.updates.append(update)
        if update.measured_longer:
            run.longer_at.append(clock.now)
        for fail in update.failed:
            cancel(outcomes[fail.request_id])
            end(fail.request_id, "failfast")
        if check is not None:
            check(planner)
        expiry = clock.now + timeout + TICK_AFTER_EXPIRY_S
        if isinstance(event, (TurnEnded, GenerationFinished)) and expiry not in ticks:
            ticks.add(expiry)
            push(expiry, "tick")
        return update

    def start_turn(rid: str, allowance: int) -> None:
        o = outcomes[rid]
        o.state, o.offered, o.turn_started = "reasoning", allowance > 0, clock.now
        push(clock.now + specs[rid].turn_s[o.turns], "turn_end", rid, o.token)
        o.turns += 1

    t = 0.0
    for i, a in enumerate(arrivals):
        t += a.gap
        push(t, "arrive", f"r{i}")
    while events:
        at, _, _, kind, rid, token = heapq.heappop(events)
        clock.now = at
        o = outcomes.get(rid)
        if kind == "arrive":
            if max_active is not None and len(planner.plan()) >= max_active:
                o.status = "refused"
                continue
            if handle(Admit(rid)).refused is not None:
                o.status = "refused"
                continue
            o.admitted, o.admitted_at, o.deadline = True, at, at + timeout
            push(o.deadline, "deadline", rid, -1)
            start_turn(rid, planner.allowance(rid))
        elif kind == "tick":
            handle(Tick())
        elif o is None or o.status or (token != o.token and kind != "deadline"):
            continue
        elif kind == "deadline":
            cancel(o)
            end(rid, "timeout")
            handle(Released(rid))
        elif kind == "turn_end":
            handle(TurnEnded(rid, at - o.turn_started))
            if o.status:
                continue
            spec = specs[rid]
            if o.offered and o.gens_done < spec.wants:
                modality = spec.modalities[o.gens_done]
                update = handle(GenerationQueued(rid, modality))
                if o.status:
                    continue
                if update.receipt is not None:
                    assert planner.allowance(rid) == 0
                    start_turn(rid, 0)
                else:
                    o.state, o.modality = "queued", modality
            else:
                end(rid, "completed")
                handle(Released(rid))
        elif kind == "gen_end":
            stage[0] = None
            handle(GenerationFinished(rid, o.modality, o.gen_s))
            o.gens_done += 1
            if not o.status:
                start_turn(rid, planner.allowance(rid))
        while stage[0] is None and (nxt := planner.next_generation()) is not None:
            n = outcomes[nxt]
            n.state, stage[0], n.gen_started = "generating", nxt, clock.now
            n.gen_s = specs[nxt].gen_s[n.gens_done]
            push(clock.now + n.gen_s, "gen_end", nxt, n.token)
            handle(GenerationStarted(nxt))
    return run
