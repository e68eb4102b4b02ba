"""The generation planner's worst-case model: when each planned request ends at the longest times.

Pure functions of the requests' states and the measured times; no state of their own.

A request alternates Reasoner turns and generations and ends with a final Reasoner turn, so a
request that may still run ``g`` generations has at most ``g + 1`` turns left. Reasoner turns of
different requests run concurrently: a turn never waits for another request. Generations run on
one generation stage, one at a time, the oldest request (admission order) first: a request's
generation queued while a younger request's runs starts at once and pauses the younger one at its
next denoising step boundary (``contract.gpu_turns``); the paused one resumes once no older
request's generation runs.

The times (:class:`~sglang_omni.pipeline.planner_times.MeasuredTimes`):

* ``R``     the longest Reasoner turn;
* ``G[m]``  the longest generation of modality ``m``, and ``g[m]`` the shortest;
* ``G``     the longest generation of any modality.

Each at the request's step count (``PlannedRequest.steps``): a request asking for more steps than
were measured counts its generations at the measured seconds per step times its steps when that
is longer (:class:`~sglang_omni.pipeline.planner_times.MeasuredTimes`).

A modality not measured yet counts at ``G`` (and its shortest at 0): its first measurement is a
longer time like any other.

Every active request has an *allowance*: the generations its Reasoner may still ask for (0 means
it is offered only a final answer). Requests are taken in admission order, and request ``i`` runs
its generations only after the stage has run every generation planned for the requests before it
(``free`` below, which starts at the worst-case end of the generation running now). For a request
at time ``now`` (:func:`worst_case`)::

    the turn running now       ends at max(turn start + R, now)
    a queued generation        starts at max(now, free), takes G[m]
    the running generation     ends at max(start + G[m], now)
    a paused generation        resumes at max(now, free), takes G[m] less what it ran
    each further generation    starts at max(previous end + R, free), takes G
    finish                     = last generation end + R  (the final answer)

A turn that was offered a generation but whose allowance dropped to 0 meanwhile still costs one
more turn: the generation it chose comes back as a receipt and the Reasoner answers. Using fewer
generations, or shorter ones, only ends everything sooner: the bound is a max-plus expression,
monotone in every duration.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from sglang_omni.pipeline.planner_times import MeasuredTimes

EPS = 1e-9
"""Slack in every "ends before its deadline" comparison (float sums of the times)."""


class Phase(enum.Enum):
    """Where a request is. ``since`` dates the turn's or the generation's start."""

    REASONING = "reasoning"  # a Reasoner turn runs
    DECIDING = "deciding"  # the turn returned; a generation or the end follows at once
    QUEUED = "queued"  # its generation waits for the stage
    GENERATING = "generating"  # its generation runs on the stage
    PAUSED = "paused"  # its generation started, then paused for an older request's


@dataclass(frozen=True)
class PlannedRequest:
    """One active request's state in the plan."""

    request_id: str
    admitted_at: float
    deadline: float
    phase: Phase
    since: float
    allowance: int  # generations the Reasoner may still ask for (not counting a pending one)
    used: int  # generations queued or run so far
    offered: bool  # whether the current (or just ended) turn was offered a generation
    modality: str | None = None  # of the pending generation
    kept_at_shortest: bool = False  # its pending generation fits only at the shortest time
    steps: int | None = None  # denoising steps of its generations (None: the engine's default)
    ran_s: float = 0.0  # paused: how long its generation ran before it was paused

    @property
    def pending(self) -> bool:
        """Whether a generation of this request is queued, running or paused."""
        return self.phase in (Phase.QUEUED, Phase.GENERATING, Phase.PAUSED)

    @property
    def final_only(self) -> bool:
        """Whether its current turn was offered only a final answer (the request is ending)."""
        return self.phase in (Phase.REASONING, Phase.DECIDING) and not self.offered


def worst_case(req: PlannedRequest, allowance: int, free: float, now: float,
               times: MeasuredTimes, *, own_at_shortest: bool = False) -> tuple[float, float]:
    """Worst-case ``(finish, free after)`` of ``req`` with ``allowance`` more generations.

    ``free`` is when the stage has run every generation planned for the earlier requests. With
    ``own_at_shortest`` the request's pending generation counts at its modality's shortest time.
    Only valid once a generation was measured.
    """
    turn = times.reasoner
    if req.phase in (Phase.REASONING, Phase.DECIDING):
        ready = now if req.phase is Phase.DECIDING else max(req.since + turn, now)
        if not req.offered:
            return ready, free
        if allowance == 0:  # a generation it chooses comes back as a receipt, then it answers
            return ready + turn, free
    else:
        assert req.modality is not None
        took = (times.shortest(req.modality) if own_at_shortest
                else times.longest(req.modality, req.steps))
        if req.phase is Phase.QUEUED:
            end = max(now, free) + took
        elif req.phase is Phase.PAUSED:  # what is left of it, once the stage is its again
            end = max(now, free) + max(0.0, took - req.ran_s)
        else:
            end = max(req.since + took, now)
        free = max(free, end)
        ready = end + turn
    for _ in range(allowance):
        free = max(ready, free) + times.generation(req.steps)
        ready = free + turn
    return ready, free


def stage_free(requests: Iterable[PlannedRequest], now: float, times: MeasuredTimes) -> float:
    """When the generation running now ends at the longest time of its modality (or ``now``)."""
    for req in requests:
        if req.phase is Phase.GENERATING:
            assert req.modality is not None
            return max(req.since + times.longest(req.modality, req.steps), now)
    return now


@dataclass(frozen=True)
class Projection:
    """A request's worst-case end on its current plan."""

    finish: float  # at the longest times
    shortest_finish: float | None  # pending generation at its shortest time, allowance 0


def project(requests: list[PlannedRequest], now: float, times: MeasuredTimes
            ) -> tuple[list[Projection], float]:
    """Each request's worst-case end on the current plan, and when the stage is free after all."""
    return project_from(requests, stage_free(requests, now, times), now, times)


def project_from(requests: list[PlannedRequest], free: float, now: float, times: MeasuredTimes
                 ) -> tuple[list[Projection], float]:
    """Like :func:`project` for requests behind a stage busy with earlier plans until ``free``."""
    out = []
    for req in requests:
        finish, after = worst_case(req, req.allowance, free, now, times)
        shortest = None
        if req.pending and req.allowance == 0:
            shortest, _ = worst_case(req, 0, free, now, times, own_at_shortest=True)
        out.append(Projection(finish, shortest))
        free = after
    return out, free


def holds(req: PlannedRequest, proj: Projection) -> bool:
    """Whether ``req``'s plan holds: it ends in time (a kept generation: at its shortest time)."""
    if req.kept_at_shortest:
        assert proj.shortest_finish is not None
        return proj.shortest_finish <= req.deadline + EPS
    if req.allowance == 0 and not req.pending:
        return True  # a final answer only: it needs no generation stage, so no plan can hurt it
    return proj.finish <= req.deadline + EPS
