"""Ray Serve request routers for the replicas (``RequestRouterConfig.request_router_class``).

:class:`DeadlineRouter` orders replicas by their routing stats and its own sends since
(:func:`~sglang_omni.scale.ranking.deadline_order`); :class:`RoundRobinRouter` takes them in turn.
Both leave out the replicas a request was already refused by (the gateway passes their ids as the
``exclude`` keyword of its call) unless every replica refused it. Ray's default,
``PowerOfTwoChoicesRequestRouter``, stays selectable as ``--router pow2`` (see
:data:`~sglang_omni.scale.spec.ROUTERS`).

Every router sends a call with a ``replica`` keyword (a relayed WebSocket session's messages) to
that replica alone (:func:`pinned`); if it is gone, to any, which answers that it has no such
session.

Built on Ray's ``ray.serve.request_router.RequestRouter`` (alpha API, Ray 2.60).
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from sglang_omni.scale import fleet_members, routed_calls, silent_replicas
from sglang_omni.scale.ranking import Since, deadline_order, rotation, should_wait
from sglang_omni.serve.ops.service_paths import is_service

#: Seconds after which the router forgets a call (a replica whose stats stopped coming).
FORGET_S = 3600.0
#: Seconds after which a request chosen for a replica but never sent there is forgotten.
UNSENT_S = 10.0
#: For a call without a ``call_id`` (or stats without ``calls``): seconds a chosen request may
#: take to reach its replica; one chosen this long before the replica recorded its stats is
#: taken as in them.
TRANSIT_S = 0.1


def heard(stats: dict[str, Any]) -> None:
    """Tell :mod:`~sglang_omni.scale.silent_replicas` when each replica last recorded its stats
    (a replica marked silent that records them again is running again)."""
    for key, st in stats.items():
        if st and st.get("at") is not None:
            silent_replicas.heard_from(key, float(st["at"]))


def excluded(pending: PendingRequest | None) -> frozenset[str]:
    """The replica ids the request was already refused by (its ``exclude`` keyword) and those
    the gateway found silent (:mod:`~sglang_omni.scale.silent_replicas`)."""
    if pending is None:
        return silent_replicas.silent()
    return frozenset(pending.kwargs.get("exclude") or ()) | silent_replicas.silent()


def pinned(candidates: list[RunningReplica], pending: PendingRequest | None
           ) -> list[list[RunningReplica]] | None:
    """The routing of a call pinned to one replica (its ``replica`` keyword): that replica, or
    every candidate when it is gone; None for a call not pinned."""
    want = pending.kwargs.get("replica") if pending is not None else None
    if want is None:
        return None
    chosen = [r for r in candidates if r.replica_id.unique_id == want]
    return noted(pending, [chosen or list(candidates)])


def noted(pending: PendingRequest | None, groups: list[list[RunningReplica]]
          ) -> list[list[RunningReplica]]:
    """``groups`` (a router's answer), its first group noted as where the call goes
    (:mod:`~sglang_omni.scale.routed_calls`; none: the router holds it)."""
    first = groups[0] if groups else []
    routed_calls.chose(call_id(pending), tuple(r.replica_id.unique_id for r in first))
    return groups


def note_routed(pending: PendingRequest, replica_id: ReplicaID) -> None:
    """Ray confirmed where the call went (``on_request_routed``)."""
    routed_calls.routed(call_id(pending), replica_id.unique_id)


def counted(pending: PendingRequest | None) -> bool:
    """Whether the replica's stats count the call in ``in_flight`` (a model request): not for a
    forwarded request to a service path (a fleet read of ``/metrics``, a relayed ``/health``),
    whose end must not give back a model request's place. Calls that carry no forwarded
    request (a WebSocket session's messages) count as their session does."""
    args = getattr(pending, "args", None) or ()
    request = args[0] if args else None
    return not (isinstance(request, dict) and isinstance(request.get("path"), str)
                and is_service(request["path"]))


def may_wait(pending: PendingRequest | None) -> bool:
    """Whether the gateway lets the request wait (its ``may_wait`` keyword: False once the
    gateway's waiting room is full)."""
    return pending is not None and pending.kwargs.get("may_wait", True) is not False


def waited(pending: PendingRequest | None, now: float) -> float | None:
    """Seconds since the request arrived at the gateway (its ``arrived_at`` keyword, wall
    clock), or None for a request the gateway does not let wait (not a planned route)."""
    arrived = pending.kwargs.get("arrived_at") if pending is not None else None
    return None if arrived is None else max(0.0, now - float(arrived))


def call_id(pending: PendingRequest | None) -> str | None:
    """The id the gateway gave this call (its ``call_id`` keyword); the replica lists the ids of
    the calls it holds in its stats (``calls``), so the router knows which of its sends the
    stats already count."""
    value = pending.kwargs.get("call_id") if pending is not None else None
    return None if value is None else str(value)


def first_only(by_id: dict[str, RunningReplica], order: list[str]
               ) -> list[list[RunningReplica]]:
    """A router's answer: the first replica of ``order`` alone. Ray takes the first group it
    can send to: given more, it falls through to the next when it cannot reach the first in
    time (a probe of its queue timed out on a loaded host), so the call would go to a replica
    the router's note (:func:`noted`) does not name, and a gateway that found that call silent
    would mark and exclude the wrong replica (its retry then went back to the frozen one).
    With one, Ray asks the router again (after a backoff) instead."""
    return [[by_id[order[0]]]] if order else []


def _by_id(replicas: list[RunningReplica]) -> dict[str, RunningReplica]:
    return {r.replica_id.unique_id: r for r in replicas}


def _backoff(pending: PendingRequest | None) -> None:
    # Ray retries at once, without sleeping, unless a policy says it should back off; with
    # every replica full that would spin.
    if pending is not None:
        pending.routing_context.should_backoff = True


class _Members:
    """Tells :mod:`~sglang_omni.scale.fleet_members` each replica set Ray gives the router."""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        fleet_members.seen(r.replica_id.unique_id for r in replicas)
        super().update_replicas(replicas)  # type: ignore[misc]


class DeadlineRouter(_Members, RequestRouter):
    """Send each request to the replica whose plan admits it earliest (see ranking).

    The router keeps, per replica, when each request it routed there was sent and when it
    ended, to correct the replica's stats by what happened since they were recorded
    (:class:`~sglang_omni.scale.ranking.Since`); calls the stats never count (:func:`counted`)
    are not kept. A request counts from the moment it is chosen
    (requests routed at once must see each other), is moved if Ray sends it elsewhere
    (``on_request_routed``), and ends with ``on_request_completed``; one chosen but never sent
    is forgotten after :data:`UNSENT_S`.

    A planned request (one the gateway sent with ``arrived_at``) that no replica admits now
    waits while one could admit it later (:func:`~sglang_omni.scale.ranking.should_wait`), at
    most ``max_wait_s`` (a keyword of ``initialize_state``; 0: never) and unless the gateway
    sent it with ``may_wait=False`` (its waiting room full): the router returns no replica, and
    Ray asks again after a backoff of at most half a second.
    """

    def initialize_state(self, max_wait_s: float = 0.0, **kwargs: Any) -> None:
        self.max_wait_s = float(max_wait_s)
        self._calls: dict[str, dict[str, _Call]] = {}
        self._where: dict[str, str] = {}  # request id -> the replica its call is filed under
        self._rng = random.Random()

    def _file(self, key: str, rid: str, now: float, sent: bool,
              pending: PendingRequest | None) -> None:
        """File request ``rid`` under replica ``key`` (moving it from where it was; a request
        whose calls all ended, retried, starts afresh)."""
        old = self._where.get(rid)
        call = self._calls.get(old, {}).pop(rid, None) if old is not None else None
        if call is None or call.ended is not None:
            call = _Call(now)
        call.sent_for_sure = call.sent_for_sure or sent
        new_id = call_id(pending)
        if new_id is not None and new_id != call.call_id:  # a new call: not listed yet
            call.call_id, call.listed = new_id, False
        self._calls.setdefault(key, {})[rid] = call
        self._where[rid] = key

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        note_routed(pending_request, replica_id)
        if not counted(pending_request):
            return
        rid = pending_request.metadata.internal_request_id
        self._file(replica_id.unique_id, rid, time.time(), sent=True, pending=pending_request)
        self._calls[replica_id.unique_id][rid].open += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """A call ended; the request ends with the last of its calls (a WebSocket session's
        messages are calls of their own under the session's request id)."""
        key = self._where.get(internal_request_id, replica_id.unique_id)
        call = self._calls.get(key, {}).get(internal_request_id)
        if call is not None:
            call.open = max(0, call.open - 1)
            if call.open == 0:
                call.ended = time.time()

    def _since(self, key: str, stats: dict[str, Any] | None, now: float) -> Since:
        """Correct the replica's stats by its calls; forget calls the stats no longer count
        (ended, or never arrived), chosen but never sent, or older than :data:`FORGET_S`.

        A call is in the stats when its id is among the stats' ``calls`` (the replica lists the
        calls it holds); for a call without an id, when it was chosen :data:`TRANSIT_S` before
        the stats were recorded. A call in flight that the stats do not count (still on its way) is
        ``unseen``; one that ended but is still counted there is
        ``ended``. A call the stats listed and no longer list has ended there (its end may
        never reach the router: Ray does not report every call's completion), as has one
        they never listed within :data:`UNSENT_S`."""
        calls = self._calls.get(key)
        if not calls:
            return Since()
        at = float(stats.get("at", 0.0)) if stats else 0.0
        held = stats.get("calls") if stats else None
        unseen = ended = 0
        for rid, call in list(calls.items()):
            if call.call_id is not None and held is not None:
                counted = call.call_id in held
                gone = not counted and (call.listed or now - call.sent > UNSENT_S)
                call.listed = call.listed or counted
            else:
                counted = call.sent <= at - TRANSIT_S and (call.ended is None
                                                           or call.ended > at)
                gone = False
            if ((call.ended is not None and not counted) or gone or now - call.sent > FORGET_S
                    or (not call.sent_for_sure and now - call.sent > UNSENT_S)):
                del calls[rid]
                self._where.pop(rid, None)
            elif not counted:
                unseen += 1
            elif call.ended is not None:
                ended += 1
        return Since(unseen, ended)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if (pin := pinned(candidate_replicas, pending_request)) is not None:
            return pin
        _backoff(pending_request)
        by_id = _by_id(candidate_replicas)
        now = time.time()
        stats = {k: r.routing_stats for k, r in by_id.items()}
        heard(stats)
        since = {k: self._since(k, stats[k], now) for k in by_id}
        for gone in set(self._calls) - set(by_id):
            for rid in self._calls.pop(gone):
                self._where.pop(rid, None)
        wait = waited(pending_request, now)
        if (wait is not None and wait < self.max_wait_s and may_wait(pending_request)
                and should_wait(sorted(by_id), stats, since, now, wait,
                                excluded(pending_request))):
            return noted(pending_request, [])
        order = deadline_order(sorted(by_id), stats, since, now, excluded(pending_request),
                               self._rng, wait or 0.0)
        if order and pending_request is not None and counted(pending_request):
            self._file(order[0], pending_request.metadata.internal_request_id, now, sent=False,
                       pending=pending_request)
        return noted(pending_request, first_only(by_id, order))


@dataclass
class _Call:
    """One request the router sent: when, whether Ray confirmed it (``sent_for_sure``), its
    calls not yet completed (``open``: a session and its messages share one request id), when
    the last ended, the gateway's id of the call (``call_id``, None for calls without) and
    whether the replica's stats have listed it (``listed``)."""

    sent: float
    ended: float | None = None
    sent_for_sure: bool = False
    open: int = 0
    call_id: str | None = None
    listed: bool = False


class RoundRobinRouter(_Members, RequestRouter):
    """Each request to the next replica in turn (healthy ones first), for comparison."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._turn = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if (pin := pinned(candidate_replicas, pending_request)) is not None:
            return pin
        _backoff(pending_request)
        by_id = _by_id(candidate_replicas)
        stats = {k: r.routing_stats for k, r in by_id.items()}
        heard(stats)
        order = rotation(sorted(by_id), next(self._turn), excluded(pending_request), stats)
        return noted(pending_request, first_only(by_id, order))

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        note_routed(pending_request, replica_id)


class PowerOfTwoRouter(_Members, PowerOfTwoChoicesRequestRouter):
    """Ray's default router (power of two choices on requests in flight) over the replicas not
    excluded (unless all are), pinned calls aside: of two replicas drawn at random, the one
    with fewer requests in flight by Ray's queue-length cache (ties: Ray's random order).

    Ray's own choice draws from every replica it knows, whatever candidates it is given, and
    answers with both of the two (Ray then sends to whichever its probe prefers): the pair is
    filtered here and one replica kept (:func:`first_only`'s reason), so an excluded or silent
    replica is never sent the call and a call found silent names the one it went to."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if (pin := pinned(candidate_replicas, pending_request)) is not None:
            return pin
        skip = excluded(pending_request)
        pool = [r for r in candidate_replicas if r.replica_id.unique_id not in skip] \
            or list(candidate_replicas)
        allowed = {r.replica_id.unique_id for r in pool}
        drawn = [r for group in await super().choose_replicas(pool, pending_request)
                 for r in group if r.replica_id.unique_id in allowed]
        if not drawn:
            drawn = random.sample(pool, min(2, len(pool)))
        cache = self.replica_queue_len_cache
        best = min(drawn, key=lambda r: cache.get(r.replica_id) or 0)
        return noted(pending_request, first_only({best.replica_id.unique_id: best},
                                                 [best.replica_id.unique_id]))

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        note_routed(pending_request, replica_id)
