"""Generation-capacity planning: which requests to admit and how many generations each may run.

The orchestrator bounds each request by ``stages.orchestrator.factory``: ``max_active`` caps the
requests held at once (memory and Reasoner concurrency), ``timeout_s`` is every request's deadline.
Generation capacity is planned here, from the generation times actually measured. This module is
pure: no I/O, no asyncio, no sleeping. Time comes from an injected ``clock`` callable, and the
orchestrator reports what happened as events (:meth:`GenerationPlanner.handle`) and acts on the
:class:`PlanUpdate` each event returns.

The model
---------
A request alternates Reasoner turns and generations and ends with a final Reasoner turn, so a
request that may still run ``g`` generations has at most ``g + 1`` turns left. Reasoner turns of
different requests run concurrently: a turn never waits for another request. Generations run on
one generation stage, one at a time, the oldest request (admission order) first.

Measured times, each over the last ``timeout_s`` (a sliding window; when all of a series' samples
have expired its latest sample stands in, so a quiet spell does not forget what was measured):

* ``R``     the longest Reasoner turn;
* ``G[m]``  the longest generation of modality ``m``, and ``g[m]`` the shortest;
* ``G``     the longest generation of any modality.

A modality not measured yet counts at ``G`` (and its shortest at 0): its first measurement is a
longer time like any other.

The plan gives every active request an *allowance*: the generations its Reasoner may still ask for
(0 means it is offered only a final answer). The plan is feasible when every request, at the
longest times, ends before its deadline in this worst case: requests are taken in admission order,
and request ``i`` runs its generations only after the stage has run every generation planned for
the requests before it (``free`` below, which starts at the worst-case end of the generation
running now). For request ``i`` at time ``now``::

    the turn running now       ends at max(turn start + R, now)
    a queued generation        starts at max(now, free), takes G[m]
    the running generation     ends at max(start + G[m], now)
    each further generation    starts at max(previous end + R, free), takes G
    finish                     = last generation end + R  (the final answer)

A turn that was offered a generation but whose allowance dropped to 0 meanwhile still costs one
more turn: the generation it chose comes back as a receipt (:data:`RECEIPT_TEXT`) and the Reasoner
answers. Using fewer generations, or shorter ones, only ends everything sooner: the bound is a
max-plus expression, monotone in every duration.

The stage serves the oldest queued generation first, and starts it only if that keeps every plan
that holds now (:meth:`GenerationPlanner.next_generation`): a generation is not preemptible, so a
later request's generation started while an older request is between two of its generations
would otherwise delay the older one beyond its plan. While the measured times hold (no generation
or turn outlasts them), every admitted request with a positive allowance therefore ends before its
deadline.

The rules (after every event the plan is settled in the stage's order):

1. *Admission.* A new request is planned behind every active request: it gets as many of its
   ``max_generations`` as end before its deadline. It is refused (HTTP 503, retry later) when that
   is fewer than an idle server would give it, or when ``max_active`` requests are active.
2. *Longer times.* When a longer time is measured (the first measurement after startup included)
   the plan is computed again in admission order, each request keeping at most its allowance. A
   request left with none is offered only a final answer; a generation it has already chosen (in
   the turn running when its allowance fell to 0) comes back to the Reasoner as a receipt saying no
   time is left. A generation already queued is never turned into a receipt: rule 3 decides it.
3. *Fail fast.* A request that cannot finish even its queued (or running) generation and a final
   answer, with that generation at the shortest time ``g[m]``, fails at once with 503, saying why
   and that it can be retried later; its generation is cancelled. A queued generation that fits
   only at ``g[m]`` keeps its place (``G[m]`` may come from a longer generation of another request).
4. *Give back.* A request whose allowance is below what it could still use gets one more whenever
   that keeps every request after it on its plan; earlier requests are served first.
5. *Startup.* Before the first generation is measured nothing can be planned: requests are
   admitted with the full allowance and the plan at the first measurement settles them, unless the
   first generation has been running longer than ``timeout_s`` (then they are refused). Likewise,
   once one generation with its two turns is measured longer than ``timeout_s``, an idle server
   would give a request no generation, and requests are refused.

Settling runs after every event, so plans also follow expired measurements (rule 4), releases,
and a turn or generation running past its measured time (its end counts as ``now``).

How an orchestrator uses it
---------------------------
See :class:`GenerationPlanner`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from sglang_omni.errors import ServiceUnavailable

SERVICE_UNAVAILABLE = ServiceUnavailable.status
"""The HTTP status of every refusal and fail-fast this module reports."""

RECEIPT_TEXT = ("No time is left before this request's deadline to run this generation; it was "
                "not run. Give the final answer now.")
"""What a generation the plan no longer allows returns to the Reasoner."""

_EPS = 1e-9


# --- configuration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannerConfig:
    """The bounds of ``stages.orchestrator.factory`` that the planner enforces.

    ``max_generations`` is the generations one request may run in all (8: ``max_dispatches`` 17 is
    eight generations and the nine Reasoner turns around them). ``max_active`` is None when the
    orchestrator caps concurrency itself.
    """

    timeout_s: float = 3600.0
    max_generations: int = 8
    max_active: int | None = 32

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_generations < 0:
            raise ValueError(f"max_generations must be >= 0, got {self.max_generations}")
        if self.max_active is not None and self.max_active < 1:
            raise ValueError(f"max_active must be >= 1 or None, got {self.max_active}")


# --- events --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Admit:
    """A new request arrived. Admitted, it starts its first Reasoner turn at once."""

    request_id: str


@dataclass(frozen=True)
class TurnEnded:
    """A Reasoner turn of the request returned after ``duration_s`` (a measurement).

    Send it before the :class:`GenerationQueued` or :class:`Released` that acts on the turn's
    outcome. Recorded even if the request is no longer active.
    """

    request_id: str
    duration_s: float


@dataclass(frozen=True)
class TurnStarted:
    """The request's next Reasoner turn started right after its last one, with no generation
    between them (its decision was answered by a receipt, such as for a blank prompt)."""

    request_id: str


@dataclass(frozen=True)
class GenerationQueued:
    """The request's Reasoner chose a generation of ``modality``; it would now wait for the stage.

    The update answers it: queued, or (allowance 0) a :class:`Receipt`, in which case the request's
    next turn, offered only a final answer, starts at once (``update.turn``).
    """

    request_id: str
    modality: str


@dataclass(frozen=True)
class GenerationStarted:
    """The generation stage started the request's queued generation (see ``next_generation``)."""

    request_id: str


@dataclass(frozen=True)
class GenerationFinished:
    """The request's generation of ``modality`` finished after ``duration_s`` (a measurement).

    The request's next Reasoner turn starts at once (``update.turn`` says what to offer it). The
    measurement is recorded even if the request is no longer active. Do not send it for a
    cancelled generation: a cancelled generation measured nothing.
    """

    request_id: str
    modality: str
    duration_s: float


@dataclass(frozen=True)
class Released:
    """The request ended (final answer, error, timeout or disconnect); cancel its generation."""

    request_id: str


@dataclass(frozen=True)
class Tick:
    """Nothing happened; time passed. Lets expired measurements raise plans (``next_expiry``)."""


Event = (Admit | TurnEnded | TurnStarted | GenerationQueued | GenerationStarted
         | GenerationFinished | Released | Tick)


# --- results -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanChange:
    """A request's allowance went from ``before`` to ``after`` (0: offer only a final answer)."""

    request_id: str
    before: int
    after: int


@dataclass(frozen=True)
class Receipt:
    """Answer the request's chosen generation with ``message`` instead of running it."""

    request_id: str
    modality: str
    message: str = RECEIPT_TEXT


@dataclass(frozen=True)
class FailFast:
    """Fail the request now with HTTP 503 and ``message``; cancel its ``cancel`` generation.

    The planner has already dropped the request; a later :class:`Released` for it is a no-op.
    """

    request_id: str
    message: str
    cancel: str  # "queued" or "running"
    status: int = SERVICE_UNAVAILABLE


@dataclass(frozen=True)
class TurnOffer:
    """The Reasoner turn the event started: offer it ``allowance`` generations (0: final only)."""

    request_id: str
    allowance: int


@dataclass(frozen=True)
class Admission:
    """The answer to :class:`Admit`. Refused: reply HTTP 503 with ``message`` (retry later)."""

    request_id: str
    admitted: bool
    allowance: int
    deadline: float
    message: str = ""
    status: int | None = None  # SERVICE_UNAVAILABLE when refused


@dataclass(frozen=True)
class PlanUpdate:
    """The consequences of one event; act on every field.

    ``lowered``/``raised``: allowance changes of other requests, applied from their next turn on.
    ``receipts``: chosen generations to answer with a receipt. ``failed``: requests to fail with
    503 now, cancelling their generation. ``turn``: what to offer the turn this event started.
    ``admission``: set for :class:`Admit`. ``measured_longer``: a longer time was measured.
    """

    lowered: tuple[PlanChange, ...] = ()
    raised: tuple[PlanChange, ...] = ()
    receipts: tuple[Receipt, ...] = ()
    failed: tuple[FailFast, ...] = ()
    turn: TurnOffer | None = None
    admission: Admission | None = None
    measured_longer: bool = False


@dataclass(frozen=True)
class MeasuredTimes:
    """The times the plan uses, in seconds; None / absent where nothing was measured.

    ``longest_s``/``shortest_s`` are by modality. Not hashable (it holds mappings).
    """

    reasoner_s: float | None = None
    longest_s: Mapping[str, float] = field(default_factory=dict)
    shortest_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def generation_s(self) -> float | None:
        """The longest generation of any modality: what a generation not yet chosen may take."""
        return max(self.longest_s.values()) if self.longest_s else None

    @property
    def reasoner(self) -> float:
        """The longest Reasoner turn, 0 before any was measured."""
        return self.reasoner_s or 0.0

    def longest(self, modality: str) -> float:
        """The longest generation of ``modality``; of any modality if that one is unmeasured.

        Only valid once a generation was measured (``generation_s`` is not None).
        """
        value = self.longest_s.get(modality, self.generation_s)
        assert value is not None, "no generation measured yet"
        return value

    def shortest(self, modality: str) -> float:
        """The shortest generation of ``modality``; 0 if unmeasured (nothing rules a fit out)."""
        return self.shortest_s.get(modality, 0.0)


@dataclass(frozen=True)
class RequestPlan:
    """One active request's plan, for logs and tests.

    ``finish`` is its worst-case end at the longest times (None before the first measurement);
    ``kept_at_shortest`` marks a queued generation kept because it fits only at the shortest time.
    """

    request_id: str
    phase: str
    allowance: int
    used: int
    deadline: float
    finish: float | None
    kept_at_shortest: bool


# --- measurement windows -------------------------------------------------------------------------
class _SlidingExtremes:
    """Longest and shortest of the samples of the last ``span`` seconds.

    Monotonic deques make ``add``, ``expire`` and reads O(1) amortised. Samples must be added in
    time order. Once every sample has expired the latest one stands in.
    """

    def __init__(self, span: float) -> None:
        self._span = span
        self._max: deque[tuple[float, float]] = deque()  # values strictly decreasing
        self._min: deque[tuple[float, float]] = deque()  # values strictly increasing
        self._latest: float | None = None

    def add(self, at: float, value: float) -> None:
        while self._max and self._max[-1][1] <= value:
            self._max.pop()
        self._max.append((at, value))
        while self._min and self._min[-1][1] >= value:
            self._min.pop()
        self._min.append((at, value))
        self._latest = value

    def expire(self, now: float) -> None:
        """Drop samples taken more than ``span`` seconds before ``now``."""
        cutoff = now - self._span
        for dq in (self._max, self._min):
            while dq and dq[0][0] < cutoff:
                dq.popleft()

    def next_expiry(self) -> float | None:
        """When the oldest sample that matters leaves the window."""
        fronts = [dq[0][0] + self._span for dq in (self._max, self._min) if dq]
        return min(fronts) if fronts else None

    @property
    def longest(self) -> float | None:
        return self._max[0][1] if self._max else self._latest

    @property
    def shortest(self) -> float | None:
        return self._min[0][1] if self._min else self._latest


# --- request state -------------------------------------------------------------------------------
class Phase(enum.Enum):
    """Where a request is. ``since`` dates the turn's or the generation's start."""

    REASONING = "reasoning"  # a Reasoner turn runs
    DECIDING = "deciding"  # the turn returned; a generation or the end follows at once
    QUEUED = "queued"  # its generation waits for the stage
    GENERATING = "generating"  # its generation runs on the stage


@dataclass(frozen=True)
class _Request:
    request_id: str
    admitted_at: float
    deadline: float
    phase: Phase
    since: float
    allowance: int  # generations the Reasoner may still ask for (not counting a pending one)
    used: int  # generations queued or run so far
    offered: bool  # whether the current (or just ended) turn was offered a generation
    modality: str | None = None  # of the pending generation
    kept_at_shortest: bool = False

    @property
    def pending(self) -> bool:
        """Whether a generation of this request is queued or running."""
        return self.phase in (Phase.QUEUED, Phase.GENERATING)

    @property
    def final_only(self) -> bool:
        """Whether its current turn was offered only a final answer (the request is ending)."""
        return self.phase in (Phase.REASONING, Phase.DECIDING) and not self.offered


# --- the worst-case model (pure functions) ------------------------------------------------------
def _path(req: _Request, allowance: int, free: float, now: float, times: MeasuredTimes,
          *, own_at_shortest: bool = False) -> tuple[float, float]:
    """Worst-case ``(finish, free after)`` of ``req`` with ``allowance`` more generations.

    ``free`` is when the stage has run every generation planned for the earlier requests. With
    ``own_at_shortest`` the request's pending generation counts at its modality's shortest time.
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
        took = times.shortest(req.modality) if own_at_shortest else times.longest(req.modality)
        if req.phase is Phase.QUEUED:
            end = max(now, free) + took
        else:
            end = max(req.since + took, now)
        free = max(free, end)
        ready = end + turn
    for _ in range(allowance):
        free = max(ready, free) + times.generation_s  # type: ignore[operator]
        ready = free + turn
    return ready, free


def _stage_free(requests: Iterable[_Request], now: float, times: MeasuredTimes) -> float:
    """When the generation running now ends at the longest time of its modality (or ``now``)."""
    for req in requests:
        if req.phase is Phase.GENERATING:
            assert req.modality is not None
            return max(req.since + times.longest(req.modality), now)
    return now


@dataclass(frozen=True)
class _Projection:
    finish: float  # at the longest times
    shortest_finish: float | None  # pending generation at its shortest time, allowance 0


def _project(requests: list[_Request], now: float, times: MeasuredTimes
             ) -> tuple[list[_Projection], float]:
    """Each request's worst-case end on the current plan, and when the stage is free after all."""
    return _project_from(requests, _stage_free(requests, now, times), now, times)


def _project_from(requests: list[_Request], free: float, now: float, times: MeasuredTimes
                  ) -> tuple[list[_Projection], float]:
    """Like ``_project`` for the requests behind a stage busy with earlier plans until ``free``."""
    out = []
    for req in requests:
        finish, after = _path(req, req.allowance, free, now, times)
        shortest = None
        if req.pending and req.allowance == 0:
            shortest, _ = _path(req, 0, free, now, times, own_at_shortest=True)
        out.append(_Projection(finish, shortest))
        free = after
    return out, free


def _holds(req: _Request, proj: _Projection) -> bool:
    """Whether ``req``'s plan holds: it ends in time (a kept generation: at its shortest time)."""
    if req.kept_at_shortest:
        assert proj.shortest_finish is not None
        return proj.shortest_finish <= req.deadline + _EPS
    if req.allowance == 0 and not req.pending:
        return True  # a final answer only: it needs no generation stage, so no plan can hurt it
    return proj.finish <= req.deadline + _EPS


# --- the planner ---------------------------------------------------------------------------------
class GenerationPlanner:
    """Admission and per-request generation allowances, planned from measured times.

    Contract with the orchestrator (one thread or one event loop; events in time order):

    1. On a new request: ``u = handle(Admit(rid))``. If ``u.admission.admitted`` is false, reply
       503 with ``u.admission.message``. Else run its first Reasoner turn offering
       ``u.admission.allowance`` generations (0: only a final answer).
    2. When a turn returns: ``handle(TurnEnded(rid, seconds))``; then, if it chose a generation,
       ``handle(GenerationQueued(rid, modality))`` -- a receipt in ``u.receipts`` goes back to the
       Reasoner and the next turn starts at once with ``u.turn`` -- or, on a final answer,
       ``handle(Released(rid))``.
    3. Whenever the generation stage is free: ``rid = next_generation()``; if not None, start that
       request's queued generation and ``handle(GenerationStarted(rid))``.
    4. When a generation ends: ``handle(GenerationFinished(rid, modality, seconds))`` and run the
       next turn offering ``u.turn.allowance`` generations.
    5. When a request ends any other way (timeout, error, disconnect): ``handle(Released(rid))``.
    6. Optionally ``handle(Tick())`` at ``next_expiry()`` so expired measurements raise plans.

    After every event act on the whole :class:`PlanUpdate`: fail each ``u.failed`` request with
    503 and its message and cancel its generation (the stage may then be free: step 3); answer each
    ``u.receipts`` generation with a receipt. ``u.lowered``/``u.raised`` need no action beyond
    asking ``allowance(rid)`` (or reading ``u.turn``) at each turn's start.
    """

    def __init__(self, config: PlannerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._reasoner = _SlidingExtremes(config.timeout_s)
        self._generation: dict[str, _SlidingExtremes] = {}
        self._requests: dict[str, _Request] = {}  # insertion order is admission order

    # --- queries ---------------------------------------------------------------------------------
    @property
    def times(self) -> MeasuredTimes:
        """The measured times the plan uses now."""
        longest = {m: w.longest for m, w in self._generation.items() if w.longest is not None}
        shortest = {m: w.shortest for m, w in self._generation.items() if w.shortest is not None}
        return MeasuredTimes(self._reasoner.longest, MappingProxyType(longest),
                             MappingProxyType(shortest))

    @property
    def active(self) -> int:
        """How many requests are active."""
        return len(self._requests)

    def allowance(self, request_id: str) -> int:
        """Generations the request's Reasoner may still ask for; 0: offer only a final answer."""
        return self._requests[request_id].allowance

    def next_generation(self) -> str | None:
        """The request whose queued generation the free stage should start now, or None.

        The oldest queued generation, if starting it now keeps every plan that holds; else None
        (wait for the next event). None while a generation runs. Changes nothing.
        """
        if self._running() is not None:
            return None
        oldest = next((r for r in self._requests.values() if r.phase is Phase.QUEUED), None)
        if oldest is None:
            return None
        times = self.times
        if times.generation_s is None:
            return oldest.request_id
        now = self._clock()
        current = list(self._requests.values())
        started = [replace(r, phase=Phase.GENERATING, since=now) if r is oldest else r
                   for r in current]
        before, _ = _project(current, now, times)
        after, _ = _project(started, now, times)
        for req, req_after, b, a in zip(current, started, before, after, strict=True):
            if _holds(req, b) and not _holds(req_after, a):
                return None
        return oldest.request_id

    def plan(self) -> tuple[RequestPlan, ...]:
        """Every active request's plan, in admission (= generation stage) order."""
        requests = list(self._requests.values())
        times = self.times
        finishes: list[float | None] = [None] * len(requests)
        if times.generation_s is not None:
            finishes = [p.finish for p in _project(requests, self._clock(), times)[0]]
        return tuple(
            RequestPlan(r.request_id, r.phase.value, r.allowance, r.used, r.deadline, finish,
                        r.kept_at_shortest)
            for r, finish in zip(requests, finishes, strict=True))

    def next_expiry(self) -> float | None:
        """When the next measurement leaves the window (a :class:`Tick` then may raise plans)."""
        times = [w.next_expiry() for w in (self._reasoner, *self._generation.values())]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # --- events ----------------------------------------------------------------------------------
    def handle(self, event: Event) -> PlanUpdate:
        """Apply one event at ``clock()``, settle the plan, and say what the orchestrator must do.

        Raises ValueError/KeyError for events that contradict the request's state (a bug in the
        caller): queuing for an unknown request, starting a generation that is not queued, etc.
        """
        now = self._clock()
        self._expire(now)
        times_before = self.times
        result = _Effects()
        if isinstance(event, Admit):
            pass  # decided after the plan is settled below
        elif isinstance(event, TurnEnded):
            self._on_turn_ended(event, now)
        elif isinstance(event, TurnStarted):
            self._on_turn_started(event, now, result)
        elif isinstance(event, GenerationQueued):
            self._on_queued(event, now, result)
        elif isinstance(event, GenerationStarted):
            self._on_started(event, now)
        elif isinstance(event, GenerationFinished):
            self._on_finished(event, now, result)
        elif isinstance(event, Released):
            self._requests.pop(event.request_id, None)
        elif not isinstance(event, Tick):
            raise TypeError(f"not a planner event: {event!r}")

        before = {rid: r.allowance for rid, r in self._requests.items()}
        failed = self._settle(now)
        if isinstance(event, Admit):
            result.admission = self._admit(event.request_id, now)
            if result.admission.admitted:
                result.turn = TurnOffer(event.request_id, result.admission.allowance)
        if result.turn_of is not None and result.turn_of in self._requests:
            req = self._requests[result.turn_of]
            self._requests[req.request_id] = replace(req, offered=req.allowance > 0)
            result.turn = TurnOffer(req.request_id, req.allowance)

        lowered, raised = [], []
        for rid, old in before.items():
            cur = self._requests.get(rid)
            if cur is not None and cur.allowance < old:
                lowered.append(PlanChange(rid, old, cur.allowance))
            elif cur is not None and cur.allowance > old:
                raised.append(PlanChange(rid, old, cur.allowance))
        return PlanUpdate(lowered=tuple(lowered), raised=tuple(raised),
                          receipts=tuple(result.receipts), failed=tuple(failed),
                          turn=result.turn, admission=result.admission,
                          measured_longer=_is_longer(times_before, self.times))

    # --- event handlers --------------------------------------------------------------------------
    def _on_turn_ended(self, event: TurnEnded, now: float) -> None:
        self._reasoner.add(now, event.duration_s)
        req = self._requests.get(event.request_id)
        if req is not None and req.phase is Phase.REASONING:
            self._requests[req.request_id] = replace(req, phase=Phase.DECIDING, since=now)

    def _on_turn_started(self, event: TurnStarted, now: float, result: _Effects) -> None:
        req = self._requests[event.request_id]
        if req.phase is not Phase.DECIDING:
            raise ValueError(f"request {req.request_id} started a turn while {req.phase.value}")
        self._requests[req.request_id] = replace(req, phase=Phase.REASONING, since=now)
        result.turn_of = req.request_id

    def _on_queued(self, event: GenerationQueued, now: float, result: _Effects) -> None:
        req = self._requests[event.request_id]
        if req.phase not in (Phase.REASONING, Phase.DECIDING):
            raise ValueError(f"request {req.request_id} queued a generation while "
                             f"{req.phase.value}")
        if req.allowance == 0:
            result.receipts.append(Receipt(req.request_id, event.modality))
            self._requests[req.request_id] = replace(req, phase=Phase.REASONING, since=now,
                                                     offered=False)
            result.turn_of = req.request_id
            return
        self._requests[req.request_id] = replace(
            req, phase=Phase.QUEUED, since=now, modality=event.modality,
            allowance=req.allowance - 1, used=req.used + 1, kept_at_shortest=False)

    def _on_started(self, event: GenerationStarted, now: float) -> None:
        req = self._requests[event.request_id]
        if req.phase is not Phase.QUEUED:
            raise ValueError(f"request {req.request_id} started a generation while "
                             f"{req.phase.value}")
        running = self._running()
        if running is not None:
            raise ValueError(f"the generation stage already runs request {running.request_id}")
        self._requests[req.request_id] = replace(req, phase=Phase.GENERATING, since=now)

    def _on_finished(self, event: GenerationFinished, now: float, result: _Effects) -> None:
        if event.modality not in self._generation:
            self._generation[event.modality] = _SlidingExtremes(self.config.timeout_s)
        self._generation[event.modality].add(now, event.duration_s)
        req = self._requests.get(event.request_id)
        if req is None:
            return
        if req.phase is not Phase.GENERATING:
            raise ValueError(f"request {req.request_id} finished a generation while "
                             f"{req.phase.value}")
        # Offered provisionally (the worst case); set from the settled allowance afterwards.
        self._requests[req.request_id] = replace(req, phase=Phase.REASONING, since=now,
                                                 offered=True, modality=None,
                                                 kept_at_shortest=False)
        result.turn_of = req.request_id

    # --- admission -------------------------------------------------------------------------------
    def _admit(self, request_id: str, now: float) -> Admission:
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already active")
        cfg = self.config
        deadline = now + cfg.timeout_s

        def refuse(message: str) -> Admission:
            return Admission(request_id, False, 0, deadline, message, SERVICE_UNAVAILABLE)

        if cfg.max_active is not None and len(self._requests) >= cfg.max_active:
            return refuse(f"The server already has {cfg.max_active} active requests "
                          "(stages.orchestrator.factory.max_active); retry later.")
        times = self.times
        if times.generation_s is None:
            running = self._running()
            if running is not None and now - running.since > cfg.timeout_s:
                return refuse(
                    f"The first generation since startup has run {now - running.since:.0f} s, "
                    f"longer than timeout_s ({cfg.timeout_s:g} s), so no generation can finish "
                    "before a request's deadline; retry later.")
            allowance = cfg.max_generations
        else:
            idle = self._fit_new(now, now, times)
            if idle == 0 and cfg.max_generations > 0:
                return refuse(
                    f"One generation ({times.generation_s:.1f} s) with the Reasoner turns around "
                    f"it ({times.reasoner:.1f} s each) takes longer than timeout_s "
                    f"({cfg.timeout_s:g} s); retry later.")
            _, free = _project(list(self._requests.values()), now, times)
            allowance = self._fit_new(now, free, times)
            if allowance < idle:
                return refuse(
                    f"The generation stage is fully planned: behind the generations planned for "
                    f"the {len(self._requests)} active requests this request could run only "
                    f"{allowance} of the {idle} generations an idle server would give it before "
                    f"its deadline (timeout_s {cfg.timeout_s:g} s); retry later.")
        self._requests[request_id] = _Request(
            request_id, now, deadline, Phase.REASONING, now, allowance, 0, allowance > 0)
        return Admission(request_id, True, allowance, deadline)

    def _fit_new(self, now: float, free: float, times: MeasuredTimes) -> int:
        """The most generations a request admitted now fits behind a stage free at ``free``."""
        probe = _Request("", now, now + self.config.timeout_s, Phase.REASONING, now, 0, 0, True)
        for allowance in range(self.config.max_generations, 0, -1):
            if _path(probe, allowance, free, now, times)[0] <= probe.deadline + _EPS:
                return allowance
        return 0

    # --- settling the plan -----------------------------------------------------------------------
    def _settle(self, now: float) -> list[FailFast]:
        """Lower plans that no longer fit (failing hopeless requests), then give back what fits."""
        times = self.times
        if times.generation_s is None:
            return []  # startup: nothing measured, nothing to plan
        failed = []
        while (failure := self._lower_pass(now, times)) is not None:
            failed.append(failure)
        self._raise_pass(now, times)
        return failed

    def _lower_pass(self, now: float, times: MeasuredTimes) -> FailFast | None:
        """Re-plan in admission order, each request keeping at most its allowance.

        Stops at the first request that must fail fast: drops it and returns its FailFast (the
        caller runs the pass again, since its generation no longer holds the stage).
        """
        requests = list(self._requests.values())
        free = _stage_free(requests, now, times)
        earlier = 0
        for req in requests:
            for allowance in range(req.allowance, -1, -1):
                finish, after = _path(req, allowance, free, now, times)
                if finish <= req.deadline + _EPS:
                    self._requests[req.request_id] = replace(req, allowance=allowance,
                                                             kept_at_shortest=False)
                    break
            else:
                if req.pending:
                    short, _ = _path(req, 0, free, now, times, own_at_shortest=True)
                    if short > req.deadline + _EPS:
                        del self._requests[req.request_id]
                        return self._fail_fast(req, short, earlier, times)
                # Its pending generation fits only at the shortest time: it keeps its place.
                # (Without one, even a final answer is late: nothing the plan can change.)
                self._requests[req.request_id] = replace(req, allowance=0,
                                                         kept_at_shortest=req.pending)
                finish, after = _path(req, 0, free, now, times)
            free = after
            earlier += 1
        return None

    def _raise_pass(self, now: float, times: MeasuredTimes) -> None:
        """In admission order, give a generation back while every request keeps its plan."""
        requests = list(self._requests.values())
        free = _stage_free(requests, now, times)  # when the plans before request i are done
        for i, req in enumerate(requests):
            while not req.final_only and req.used + req.allowance < self.config.max_generations:
                trial = replace(req, allowance=req.allowance + 1, kept_at_shortest=False)
                finish, after = _path(trial, trial.allowance, free, now, times)
                if finish > trial.deadline + _EPS:
                    break
                later = requests[i + 1:]
                projections, _ = _project_from(later, after, now, times)
                if not all(_holds(r, p) for r, p in zip(later, projections, strict=True)):
                    break
                req = requests[i] = self._requests[req.request_id] = trial
            free = _path(req, req.allowance, free, now, times)[1]

    def _fail_fast(self, req: _Request, short_finish: float, earlier: int,
                   times: MeasuredTimes) -> FailFast:
        assert req.modality is not None
        where = "running" if req.phase is Phase.GENERATING else "queued"
        message = (
            f"The request cannot finish before its deadline (timeout_s {self.config.timeout_s:g} "
            f"s after admission): even at the shortest {req.modality} time measured "
            f"({times.shortest(req.modality):.1f} s) its {where} {req.modality} generation, "
            f"behind the generations planned for {earlier} earlier request(s), and a final answer "
            f"({times.reasoner:.1f} s) would end {short_finish - req.admitted_at:.1f} s after "
            "admission. Its generation was cancelled. The server is overloaded; retry later.")
        return FailFast(req.request_id, message, where)

    # --- helpers ---------------------------------------------------------------------------------
    def _running(self) -> _Request | None:
        return next((r for r in self._requests.values() if r.phase is Phase.GENERATING), None)

    def _expire(self, now: float) -> None:
        self._reasoner.expire(now)
        for window in self._generation.values():
            window.expire(now)


@dataclass
class _Effects:
    """What one event's own handling produced, before the plan is settled."""

    receipts: list[Receipt] = field(default_factory=list)
    turn_of: str | None = None
    turn: TurnOffer | None = None
    admission: Admission | None = None


def _is_longer(before: MeasuredTimes, after: MeasuredTimes) -> bool:
    """Whether ``after`` holds a longer time than ``before`` (a first measurement counts)."""
    if after.reasoner_s is not None and (before.reasoner_s is None
                                         or after.reasoner_s > before.reasoner_s):
        return True
    return any(m not in before.longest_s or value > before.longest_s[m]
               for m, value in after.longest_s.items())
