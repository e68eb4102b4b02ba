"""The order in which the deadline-aware router tries replicas: pure code over routing stats.

Each replica reports routing stats (:mod:`~sglang_omni.scale.stats`): its health, its requests in
flight and, for the interleaved pipeline, its planner's quote (what admission would give a new
request now: :class:`~sglang_omni.pipeline.planner_events.Quote`). Stats are some tenths of a
second old when a request is routed, so the router corrects them with what it saw since they were
recorded (:class:`Since`): each request it sent that the stats do not count yet (``unseen``;
the replica lists the calls it holds), and each the replica holds on a planned route but its
planner has not admitted yet, holds the replica's stage as long as the plan of an admitted request
would, ``idle`` generations of ``generation_s`` at worst;
each request in the stats that has ended since (``ended``) gives back its share of the stage's
planned time (the planned time is shared out evenly over the planner's active requests: the stats
do not say which request holds how much).

A replica *admits* a request when it is healthy, below ``max_active``, and its stage, at that
estimate, is free within its quote's horizon (the planner's own admission rule), less the time the
request already waited in the gateway's queue (its deadline counts from its arrival there). The
order:
replicas that admit before those that do not, then the earliest stage (so the request's first
generation starts soonest), then the fewest requests in flight; ties are broken at random. The
router never prefers a replica that would refuse a request while another would admit it.

A request that no replica admits now *waits* (:func:`should_wait`) when one could admit it later:
a healthy replica with a planner whose horizon the request's wait has not used up. Replicas'
planned times are worst cases, so stages free up earlier than planned and a waiting request is
admitted then, instead of being refused with 503 while the fleet still has time for it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
EPS = 1e-6


@dataclass(frozen=True, order=True)
class Standing:
    """A replica's place in the order (smaller is better): ``refuses`` first, then
    ``free_in_s`` (seconds until its generation stage could start this request's first
    generation), then ``load`` (requests in flight, unseen sends included)."""

    refuses: bool
    free_in_s: float
    load: int


UNKNOWN = Standing(True, math.inf, 1 << 30)
"""A replica without stats yet, or not healthy: tried last."""


@dataclass(frozen=True)
class Since:
    """What the router saw of a replica beyond its stats: requests it sent that are running but
    not counted in them (``unseen``), and requests counted in them that have ended since
    (``ended``)."""

    unseen: int = 0
    ended: int = 0


def standing(stats: Mapping[str, Any] | None, since: Since, now: float,
             waited_s: float = 0.0) -> Standing:
    """Where a replica stands for a request routed at ``now`` (wall-clock seconds, the clock of
    ``stats["at"]``) after waiting ``waited_s`` in the gateway, its stats corrected by
    ``since``."""
    if not stats or stats.get("health") != "ok":
        return UNKNOWN
    elapsed = max(0.0, now - float(stats.get("at", now)))
    in_flight = int(stats.get("in_flight", 0))
    load = max(0, in_flight - since.ended) + since.unseen
    max_active = stats.get("max_active")
    full = max_active is not None and load >= int(max_active)
    quote = stats.get("quote")
    if not quote:  # no planner (text-only chat, direct generation): the load alone, counting
        # the stage jobs that outlive their requests (video jobs)
        return Standing(full, 0.0, max(load, int(stats.get("stage_jobs", 0)) + since.unseen))
    generation_s = quote.get("generation_s") or 0.0
    planned = max(0.0, float(quote["stage_free_in_s"]) - elapsed)
    active = int(quote.get("active", 0))
    if since.ended and active:
        planned *= max(0, active - since.ended) / active
    # requests the replica holds on a planned route but its planner does not (yet): on their
    # way to admission, they will hold the stage as an admitted one does (less those ended
    # since: stats recorded while a request was being admitted must not outlive it)
    admitting = max(0, int(stats.get("planned_in_flight", 0)) - active - since.ended)
    free_in = planned + (since.unseen + admitting) * int(quote["idle"]) * float(generation_s)
    horizon = quote.get("horizon_s")
    if horizon is None:  # nothing measured yet (admits), or no generation fits (refuses)
        refuses = bool(quote["refused"])
    else:
        refuses = free_in > float(horizon) - waited_s + EPS
    return Standing(full or refuses, free_in, load)


def could_admit_later(stats: Mapping[str, Any] | None, waited_s: float) -> bool:
    """Whether a replica that refuses a request now may admit it later: it is healthy and
    plans generations (a quote with a horizon) and the request's wait leaves some of that
    horizon (an idle stage would admit it)."""
    if not stats or stats.get("health") != "ok":
        return False
    quote = stats.get("quote")
    horizon = quote.get("horizon_s") if quote else None
    return horizon is not None and waited_s < float(horizon) - EPS


def should_wait(replicas: Sequence[K], stats: Mapping[K, Mapping[str, Any] | None],
                since: Mapping[K, Since], now: float, waited_s: float,
                exclude: frozenset[K] = frozenset()) -> bool:
    """Whether a request that waited ``waited_s`` should keep waiting rather than be sent now:
    no replica (of those not in ``exclude``, unless all are) admits it now, and one could
    later."""
    pool = [r for r in replicas if r not in exclude] or list(replicas)
    if not pool or any(not standing(stats.get(r), since.get(r, Since()), now, waited_s).refuses
                       for r in pool):
        return False
    return any(could_admit_later(stats.get(r), waited_s) for r in pool)


def deadline_order(replicas: Sequence[K], stats: Mapping[K, Mapping[str, Any] | None],
                   since: Mapping[K, Since], now: float, exclude: frozenset[K] = frozenset(),
                   rng: random.Random | None = None, waited_s: float = 0.0) -> list[K]:
    """``replicas`` best first for a request that waited ``waited_s`` (see the module
    docstring), those in ``exclude`` (already tried for this request) left out unless every
    replica is excluded."""
    pool = [r for r in replicas if r not in exclude] or list(replicas)
    draw = (rng or random).random
    keyed = [(standing(stats.get(r), since.get(r, Since()), now, waited_s), draw(), r)
             for r in pool]
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [r for _, _, r in keyed]


def rotation(replicas: Sequence[K], turn: int, exclude: frozenset[K] = frozenset(),
             stats: Mapping[K, Mapping[str, Any] | None] | None = None) -> list[K]:
    """Round robin: ``replicas`` (in a stable order) starting at position ``turn``, healthy ones
    first (by their stats, when known), ``exclude`` left out unless every replica is."""
    pool = [r for r in replicas if r not in exclude] or list(replicas)
    if not pool:
        return []
    start = turn % len(pool)
    ring = pool[start:] + pool[:start]
    if stats is None:
        return ring

    def sick(r: K) -> bool:
        s = stats.get(r)
        return bool(s) and s.get("health") != "ok"  # type: ignore[union-attr]

    return [r for r in ring if not sick(r)] + [r for r in ring if sick(r)]
