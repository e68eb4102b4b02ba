"""Generation-capacity planning: which requests to admit and how many generations each may run.

The orchestrator caps the requests held at once (``stages.orchestrator.factory.max_active``);
``timeout_s`` is every request's deadline. Generation capacity is planned here, from the
generation times actually measured (:mod:`~sglang_omni.pipeline.planner_times`), with the
worst-case model of :mod:`~sglang_omni.pipeline.planner_model`. The planner is pure: no I/O, no
asyncio, no sleeping. Time comes from an injected ``clock`` callable; the scheduler reports what
happened as events (:mod:`~sglang_omni.pipeline.planner_events`) and acts on the
:class:`PlanUpdate` each event returns.

The plan is feasible when every request, at the longest times, ends before its deadline. The stage
serves the oldest queued generation first, and starts it only if that keeps every plan that holds
now (:meth:`GenerationPlanner.next_generation`): a later request's generation started while an
older request is between two of its generations would otherwise delay the older one beyond its
plan. With ``PlannerConfig.preempt`` (every backend but native) an older request's generation
queued while a younger one's runs starts at once: the stage pauses the younger at its next
denoising step boundary (``contract.gpu_turns``), and the plan counts it *paused*, what is left of
it after the older request's generations, so its expected finish moves by the older one's time.
While the measured times hold (no generation or turn outlasts them), every admitted request
with a positive allowance therefore ends before its deadline.

The rules (after every event the plan is settled in the stage's order):

1. *Admission.* A new request is planned behind every active request: it gets as many of its
   ``max_generations`` as end before its deadline. It is refused (HTTP 503, retry later) when that
   is fewer than an idle server would give it. A request that already waited elsewhere (a
   fleet gateway's queue: ``Admit.waited_s``) has its deadline that much earlier, and is compared
   with what an idle server would have given it on arrival.
2. *Longer times.* When a longer time is measured (the first measurement after startup included)
   the plan is computed again in admission order, each request keeping at most its allowance. A
   request left with none is offered only a final answer; a generation it has already chosen (in
   the turn running when its allowance fell to 0) comes back to the Reasoner as a receipt
   (:data:`RECEIPT_TEXT`) saying no time is left. A generation already queued is never turned
   into a receipt: rule 3 decides it.
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

The events and results are re-exported here: import the planner's API from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType

from sglang_omni.pipeline.planner_events import (
    RECEIPT_TEXT,
    Admit,
    Event,
    FailFast,
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    PlanChange,
    PlannerConfig,
    PlanUpdate,
    Quote,
    Released,
    RequestPlan,
    Tick,
    TurnEnded,
    TurnStarted,
)
from sglang_omni.pipeline.planner_model import (
    EPS,
    Phase,
    PlannedRequest,
    holds,
    project,
    project_from,
    stage_free,
    worst_case,
)
from sglang_omni.pipeline.planner_times import MeasuredTimes, SlidingExtremes

__all__ = [
    "RECEIPT_TEXT", "Admit", "Event", "FailFast", "GenerationFinished", "GenerationPlanner",
    "GenerationQueued", "GenerationStarted", "MeasuredTimes", "PlanChange", "PlannerConfig",
    "PlanUpdate", "Quote", "Released", "RequestPlan", "Tick", "TurnEnded", "TurnStarted",
]


class GenerationPlanner:
    """Admission and per-request generation allowances, planned from measured times.

    Contract with the scheduler (one thread or one event loop; events in time order):

    1. On a new request: ``u = handle(Admit(rid))``. If ``u.refused`` is set, reply 503 with it.
       Else run its first Reasoner turn offering ``allowance(rid)`` generations (0: only a final
       answer).
    2. When a turn returns: ``handle(TurnEnded(rid, seconds))``; then, if it chose a generation,
       ``u = handle(GenerationQueued(rid, modality))`` -- if ``u.receipt`` is set the generation
       is not run: the receipt goes back to the Reasoner, whose next turn has started, offered
       only a final answer -- or, on a final answer, ``handle(Released(rid))``. If the adapter
       itself answers the decision (a blank prompt), ``handle(TurnStarted(rid))`` as the next
       turn starts.
    3. Whenever the generation stage is free: ``rid = next_generation()``; if not None, start that
       request's queued generation and ``handle(GenerationStarted(rid))``.
    4. When a generation ends: ``handle(GenerationFinished(rid, modality, seconds))`` and run the
       next turn offering ``allowance(rid)`` generations.
    5. When a request ends any other way (timeout, error, disconnect): ``handle(Released(rid))``.
    6. While requests are active, ``handle(Tick())`` every so often, so that expired measurements
       and turns or generations running past their measured time move the plans.

    After every event act on the whole :class:`PlanUpdate`: fail each ``u.failed`` request with
    503 and its message and cancel its generation (the stage may then be free: step 3).
    """

    def __init__(self, config: PlannerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._reasoner = SlidingExtremes(config.timeout_s)
        self._generation: dict[str, SlidingExtremes] = {}
        self._per_step: dict[str, SlidingExtremes] = {}  # seconds per step, steps known
        self._default_steps: dict[str, int] = {}  # steps run by requests that named none
        self._requests: dict[str, PlannedRequest] = {}  # insertion order is admission order

    # --- queries ---------------------------------------------------------------------------------
    @property
    def times(self) -> MeasuredTimes:
        """The measured times the plan uses now."""
        longest = {m: w.longest for m, w in self._generation.items() if w.longest is not None}
        shortest = {m: w.shortest for m, w in self._generation.items() if w.shortest is not None}
        per_step = {m: w.longest for m, w in self._per_step.items() if w.longest is not None}
        return MeasuredTimes(self._reasoner.longest, MappingProxyType(longest),
                             MappingProxyType(shortest), MappingProxyType(per_step),
                             MappingProxyType(self._default_steps))

    def allowance(self, request_id: str) -> int:
        """Generations the request's Reasoner may still ask for; 0: offer only a final answer.

        KeyError for a request the planner does not hold.
        """
        return self._requests[request_id].allowance

    def next_generation(self) -> str | None:
        """The request whose queued generation the free stage should start now, or None.

        The oldest queued generation, if starting it now keeps every plan that holds; else None
        (wait for the next event). While a generation runs, only one of an older request
        (``PlannerConfig.preempt``): the running one is then paused. Changes nothing.
        """
        running = self._running()
        oldest = next((r for r in self._requests.values() if r.phase is Phase.QUEUED), None)
        if oldest is None:
            return None
        if running is not None and not (self.config.preempt and self._older(oldest, running)):
            return None
        times = self.times
        if times.generation_s is None:
            return oldest.request_id
        now = self._clock()
        current = list(self._requests.values())
        started = [replace(r, phase=Phase.GENERATING, since=now) if r is oldest else
                   _paused(r, now) if r is running else r
                   for r in current]
        before, _ = project(current, now, times)
        after, _ = project(started, now, times)
        for req, req_after, b, a in zip(current, started, before, after, strict=True):
            if holds(req, b) and not holds(req_after, a):
                return None
        return oldest.request_id

    def plan(self) -> tuple[RequestPlan, ...]:
        """Every active request's plan, in admission (= generation stage) order."""
        requests = list(self._requests.values())
        times = self.times
        finishes: list[float | None] = [None] * len(requests)
        if times.generation_s is not None:
            finishes = [p.finish for p in project(requests, self._clock(), times)[0]]
        return tuple(
            RequestPlan(r.request_id, r.phase.value, r.allowance, r.used, r.deadline, finish,
                        r.kept_at_shortest)
            for r, finish in zip(requests, finishes, strict=True))

    def quote(self) -> Quote:
        """What admission would give a new request now (see :class:`Quote`); changes nothing."""
        now = self._clock()
        times = self.times
        allowance, idle, refusal = self._offer(now)
        free_in = horizon = None
        if times.generation_s is not None:
            free_in = project(list(self._requests.values()), now, times)[1] - now
            if idle > 0:
                # Behind a stage free after its first turn, a request's plan ends a fixed tail
                # after the stage is free: the stage may be free until its deadline less that.
                probe = self._probe(now)
                start = now + times.reasoner
                finish, _ = worst_case(probe, idle, start, now, times)
                horizon = self.config.timeout_s - (finish - start)
        return Quote(allowance, idle, refusal is not None, free_in or 0.0, horizon,
                     times.generation_s, len(self._requests))

    # --- events ----------------------------------------------------------------------------------
    def handle(self, event: Event) -> PlanUpdate:
        """Apply one event at ``clock()``, settle the plan, and say what the scheduler must do.

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
        self._resume(now)

        before = {rid: r.allowance for rid, r in self._requests.items()}
        failed = self._settle(now)
        if isinstance(event, Admit):
            result.refused = self._admit(event.request_id, now, event.waited_s, event.steps)
        if result.turn_of is not None and result.turn_of in self._requests:
            # The turn this event started is offered a generation if the settled plan allows one.
            req = self._requests[result.turn_of]
            self._requests[req.request_id] = replace(req, offered=req.allowance > 0)

        lowered = []
        for rid, old in before.items():
            cur = self._requests.get(rid)
            if cur is not None and cur.allowance < old:
                lowered.append(PlanChange(rid, old, cur.allowance))
        return PlanUpdate(refused=result.refused, receipt=result.receipt, failed=tuple(failed),
                          lowered=tuple(lowered),
                          measured_longer=self.times.is_longer_than(times_before))

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
        if req.allowance == 0:  # answered with a receipt: the next turn starts at once
            result.receipt = RECEIPT_TEXT
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
            if not (self.config.preempt and self._older(req, running)):
                raise ValueError(f"the generation stage already runs request "
                                 f"{running.request_id}")
            self._requests[running.request_id] = _paused(running, now)
        self._requests[req.request_id] = replace(req, phase=Phase.GENERATING, since=now)

    def _on_finished(self, event: GenerationFinished, now: float, result: _Effects) -> None:
        if event.modality not in self._generation:
            self._generation[event.modality] = SlidingExtremes(self.config.timeout_s)
        self._generation[event.modality].add(now, event.duration_s)
        if event.steps is not None and event.steps > 0:
            if event.modality not in self._per_step:
                self._per_step[event.modality] = SlidingExtremes(self.config.timeout_s)
            self._per_step[event.modality].add(now, event.duration_s / event.steps)
        req = self._requests.get(event.request_id)
        if req is None:
            return
        if req.steps is None and event.steps is not None and event.steps > 0:
            self._default_steps[event.modality] = event.steps  # the engine's default count
        if req.phase not in (Phase.GENERATING, Phase.PAUSED):  # a job that could not pause
            raise ValueError(f"request {req.request_id} finished a generation while "
                             f"{req.phase.value}")
        # Offered provisionally (the worst case); set from the settled allowance afterwards.
        self._requests[req.request_id] = replace(req, phase=Phase.REASONING, since=now,
                                                 offered=True, modality=None,
                                                 kept_at_shortest=False)
        result.turn_of = req.request_id

    # --- admission -------------------------------------------------------------------------------
    def _admit(self, request_id: str, now: float, waited_s: float = 0.0,
               steps: int | None = None) -> str | None:
        """Plan a new request (rule 1, rule 5) of ``steps`` denoising steps a generation that
        already waited ``waited_s`` elsewhere; the refusal message, or None when admitted."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already active")
        waited_s = max(0.0, waited_s)
        allowance, _, refusal = self._offer(now, waited_s, steps)
        if refusal is None:
            self._requests[request_id] = PlannedRequest(
                request_id, now, now - waited_s + self.config.timeout_s, Phase.REASONING, now,
                allowance, 0, allowance > 0, steps=steps)
        return refusal

    def _offer(self, now: float, waited_s: float = 0.0, steps: int | None = None
               ) -> tuple[int, int, str | None]:
        """``(allowance, idle allowance, refusal)`` of a request of ``steps`` steps a
        generation admitted now after waiting ``waited_s`` elsewhere (the idle allowance is an
        idle server's on its arrival); changes nothing."""
        cfg = self.config
        times = self.times
        if times.generation_s is None:
            running = self._running()
            if running is not None and now - running.since > cfg.timeout_s:
                return 0, cfg.max_generations, (
                    f"The first generation since startup has run {now - running.since:.0f} "
                    f"s, longer than timeout_s ({cfg.timeout_s:g} s), so no generation can "
                    "finish before a request's deadline; retry later.")
            return cfg.max_generations, cfg.max_generations, None
        idle = self._fit_new(now, now, times, steps=steps)
        if idle == 0 and cfg.max_generations > 0:
            if steps is not None and self._fit_new(now, now, times) > 0:
                return 0, 0, self._too_many_steps(steps, times)
            return 0, 0, (
                f"One generation ({times.generation_s:.1f} s) with the Reasoner turns "
                f"around it ({times.reasoner:.1f} s each) takes longer than timeout_s "
                f"({cfg.timeout_s:g} s); retry later.")
        _, free = project(list(self._requests.values()), now, times)
        allowance = self._fit_new(now, free, times, waited_s, steps)
        if allowance < idle:
            if waited_s > 0 and allowance >= self._fit_new(now, now, times, waited_s, steps):
                # the active requests cost it nothing: its wait alone did (an idle replica too)
                return allowance, idle, (
                    f"This request waited {waited_s:.1f} s in the fleet's queue, which leaves "
                    f"it time for only {allowance} of the {idle} generations an idle server "
                    f"would have given it on arrival (timeout_s {cfg.timeout_s:g} s counts from "
                    "its arrival at the gateway); retry later.")
            waited = (f", after waiting {waited_s:.1f} s in the fleet's queue" if waited_s > 0
                      else "")
            return allowance, idle, (
                f"The generation stage is fully planned: behind the generations planned "
                f"for the {len(self._requests)} active requests this request could run "
                f"only {allowance} of the {idle} generations an idle server would give it "
                f"before its deadline (timeout_s {cfg.timeout_s:g} s{waited}); retry later.")
        return allowance, idle, None

    def _fit_new(self, now: float, free: float, times: MeasuredTimes,
                 waited_s: float = 0.0, steps: int | None = None) -> int:
        """The most generations of ``steps`` steps a request admitted now, after waiting
        ``waited_s`` elsewhere, fits behind a stage free at ``free``."""
        probe = replace(self._probe(now, waited_s), steps=steps)
        for allowance in range(self.config.max_generations, 0, -1):
            if worst_case(probe, allowance, free, now, times)[0] <= probe.deadline + EPS:
                return allowance
        return 0

    def _probe(self, now: float, waited_s: float = 0.0) -> PlannedRequest:
        """A request admitted at ``now`` (after waiting ``waited_s`` elsewhere) whose first turn
        runs, offered a generation."""
        return PlannedRequest("", now, now - waited_s + self.config.timeout_s, Phase.REASONING,
                              now, 0, 0, True)

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
        """Re-plan in admission order, each request keeping at most its allowance (rules 2, 3).

        Stops at the first request that must fail fast: drops it and returns its FailFast (the
        caller runs the pass again, since its generation no longer holds the stage).
        """
        requests = list(self._requests.values())
        free = stage_free(requests, now, times)
        earlier = 0
        for req in requests:
            for allowance in range(req.allowance, -1, -1):
                finish, after = worst_case(req, allowance, free, now, times)
                if finish <= req.deadline + EPS:
                    self._requests[req.request_id] = replace(req, allowance=allowance,
                                                             kept_at_shortest=False)
                    break
            else:
                if req.pending:
                    short, _ = worst_case(req, 0, free, now, times, own_at_shortest=True)
                    if short > req.deadline + EPS:
                        del self._requests[req.request_id]
                        return self._fail_fast(req, short, earlier, times)
                # Its pending generation fits only at the shortest time: it keeps its place.
                # (Without one, even a final answer is late: nothing the plan can change.)
                self._requests[req.request_id] = replace(req, allowance=0,
                                                         kept_at_shortest=req.pending)
                finish, after = worst_case(req, 0, free, now, times)
            free = after
            earlier += 1
        return None

    def _raise_pass(self, now: float, times: MeasuredTimes) -> None:
        """Give generations back, oldest request first, while every plan still holds (rule 4)."""
        requests = list(self._requests.values())
        free = stage_free(requests, now, times)  # when the plans before request i are done
        for i, req in enumerate(requests):
            while not req.final_only and req.used + req.allowance < self.config.max_generations:
                trial = replace(req, allowance=req.allowance + 1, kept_at_shortest=False)
                finish, after = worst_case(trial, trial.allowance, free, now, times)
                if finish > trial.deadline + EPS:
                    break
                later = requests[i + 1:]
                projections, _ = project_from(later, after, now, times)
                if not all(holds(r, p) for r, p in zip(later, projections, strict=True)):
                    break
                req = requests[i] = self._requests[req.request_id] = trial
            free = worst_case(req, req.allowance, free, now, times)[1]

    def _too_many_steps(self, steps: int, times: MeasuredTimes) -> str:
        """Why a request whose ``steps`` alone rule out every generation is refused."""
        per_step = max(times.step_s.values())
        fit = int(max(0.0, self.config.timeout_s - 2 * times.reasoner) / per_step)
        return (f"One generation of {steps} denoising steps ({times.generation(steps):.1f} s "
                f"at the {per_step:.2f} s a step measured) with the Reasoner turns around it "
                f"({times.reasoner:.1f} s each) takes longer than timeout_s "
                f"({self.config.timeout_s:g} s); ask for fewer num_inference_steps (about "
                f"{fit} fit).")

    def _fail_fast(self, req: PlannedRequest, short_finish: float, earlier: int,
                   times: MeasuredTimes) -> FailFast:
        assert req.modality is not None
        where = {Phase.GENERATING: "running", Phase.PAUSED: "paused"}.get(req.phase, "queued")
        message = (
            f"The request cannot finish before its deadline (timeout_s {self.config.timeout_s:g} "
            f"s after admission): even at the shortest {req.modality} time measured "
            f"({times.shortest(req.modality):.1f} s) its {where} {req.modality} generation, "
            f"behind the generations planned for {earlier} earlier request(s), and a final answer "
            f"({times.reasoner:.1f} s) would end {short_finish - req.admitted_at:.1f} s after "
            "admission. Its generation was cancelled. The server is overloaded; retry later.")
        return FailFast(req.request_id, message)

    # --- helpers ---------------------------------------------------------------------------------
    def _running(self) -> PlannedRequest | None:
        return next((r for r in self._requests.values() if r.phase is Phase.GENERATING), None)

    def _older(self, a: PlannedRequest, b: PlannedRequest) -> bool:
        """Whether ``a`` was admitted before ``b``."""
        order = list(self._requests)
        return order.index(a.request_id) < order.index(b.request_id)

    def _resume(self, now: float) -> None:
        """A free stage resumes the oldest paused generation (as the stage's turns do)."""
        if self._running() is not None:
            return
        paused = next((r for r in self._requests.values() if r.phase is Phase.PAUSED), None)
        if paused is not None:
            self._requests[paused.request_id] = replace(
                paused, phase=Phase.GENERATING, since=now - paused.ran_s, ran_s=0.0)

    def _expire(self, now: float) -> None:
        self._reasoner.expire(now)
        for series in (self._generation, self._per_step):
            for window in series.values():
                window.expire(now)


def _paused(req: PlannedRequest, now: float) -> PlannedRequest:
    """``req``'s running generation, paused at ``now`` for an older request's."""
    return replace(req, phase=Phase.PAUSED, since=now, ran_s=max(0.0, now - req.since))


@dataclass
class _Effects:
    """What one event's own handling produced, before the plan is settled."""

    receipt: str | None = None
    refused: str | None = None
    turn_of: str | None = None  # the request whose next turn the event started
