"""What the scheduler and the generation planner tell each other.

The scheduler (:mod:`sglang_omni.pipeline.scheduling`) reports what happened as events to
:meth:`~sglang_omni.pipeline.planner.GenerationPlanner.handle` and acts on the
:class:`PlanUpdate` each event returns. Refusals and fail-fasts are HTTP 503 (retry later); the
scheduler raises them as :class:`~sglang_omni.errors.ServiceUnavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass

RECEIPT_TEXT = ("No time is left before this request's deadline to run this generation; it was "
                "not run. Give the final answer now.")
"""What a generation the plan no longer allows returns to the Reasoner."""


@dataclass(frozen=True)
class PlannerConfig:
    """The bounds of ``stages.orchestrator.factory`` that the planner enforces.

    ``timeout_s`` is every request's deadline after admission, and the span of the measurement
    window. ``max_generations`` is the generations one request may run in all (8:
    ``max_dispatches`` 17 is eight generations and the nine Reasoner turns around them). The
    orchestrator caps the requests active at once (``max_active``) before it admits one here.
    """

    timeout_s: float = 3600.0
    max_generations: int = 8
    #: Whether an older request's generation may start while a younger one's runs, pausing it
    #: (the stage's engine pauses at denoising step boundaries; native generation does not).
    preempt: bool = True

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_generations < 0:
            raise ValueError(f"max_generations must be >= 0, got {self.max_generations}")


# --- events --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Admit:
    """A new request arrived. Admitted (``update.refused`` is None), it starts its first Reasoner
    turn at once, offered ``allowance(request_id)`` generations.

    ``waited_s``: how long the request already waited before it reached this server (in a
    fleet gateway's queue; 0 for a client's own request). Its deadline is ``timeout_s`` after it
    arrived there, and it is admitted only if that still leaves it what an idle server would
    have given it on arrival.

    ``steps``: the denoising steps the request asks of each generation (None: the engine's
    default). More steps than were measured are planned at the measured seconds per step."""

    request_id: str
    waited_s: float = 0.0
    steps: int | None = None


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
    between them (the adapter answered its decision with a receipt, such as for a blank prompt).
    Not sent after the planner's own receipt (``update.receipt``): that turn started already."""

    request_id: str


@dataclass(frozen=True)
class GenerationQueued:
    """The request's Reasoner chose a generation of ``modality``; it now waits for the stage.

    Unless the plan no longer allows it: then ``update.receipt`` answers it instead, and the
    request's next turn, offered only a final answer, has started at once.
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

    The request's next Reasoner turn starts at once, offered ``allowance(request_id)``
    generations. The measurement is recorded even if the request is no longer active. Do not send
    it for a cancelled generation: a cancelled generation measured nothing. ``steps``: the
    denoising steps it ran, if known (then it is also a sample of seconds per step).
    """

    request_id: str
    modality: str
    duration_s: float
    steps: int | None = None


@dataclass(frozen=True)
class Released:
    """The request ended (final answer, error, timeout or disconnect); drop its plan. A no-op for
    a request the planner does not hold (refused, failed fast, released already)."""

    request_id: str


@dataclass(frozen=True)
class Tick:
    """Nothing happened; time passed. Lets expired measurements raise plans, and a turn or
    generation running past its measured time lower them (its end counts as now)."""


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
class FailFast:
    """Fail the request now with HTTP 503 and ``message``, cancelling its queued or running
    generation. The planner has already dropped the request; a later :class:`Released` for it is
    a no-op."""

    request_id: str
    message: str


@dataclass(frozen=True)
class PlanUpdate:
    """The consequences of one event; act on every field.

    ``refused``: set when the :class:`Admit` was refused: reply 503 with this message.
    ``receipt``: set when the :class:`GenerationQueued` is not allowed: answer the chosen
    generation with this text instead of running it. ``failed``: requests to fail with 503 now.
    ``lowered``: other requests whose allowance fell, applied from their next turn on (for logs:
    each turn asks ``allowance``). ``measured_longer``: a longer time was measured, so the plans
    were computed again (for logs).
    """

    refused: str | None = None
    receipt: str | None = None
    failed: tuple[FailFast, ...] = ()
    lowered: tuple[PlanChange, ...] = ()
    measured_longer: bool = False


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


@dataclass(frozen=True)
class Quote:
    """What admission would give a new request now (:meth:`GenerationPlanner.quote`); routers
    of several servers compare quotes to send a request where its plan starts earliest.

    ``allowance``: the generations a request admitted now would be planned; ``idle``: what an
    idle server would give it; ``refused``: admission would refuse it (503) now.
    ``stage_free_in_s``: seconds until the generation stage has run every planned generation at
    the longest times (0 before any generation was measured). ``horizon_s``: the latest
    ``stage_free_in_s`` at which a request admitted now still gets ``idle`` (a request admitted
    ``d`` seconds later tolerates a stage free ``d`` seconds later too); None when nothing bounds
    it (nothing measured yet, or an idle server plans no generation). ``generation_s``: the
    longest generation measured (None before the first), what each more planned generation may
    hold the stage. ``active``: the requests the planner holds.
    """

    allowance: int
    idle: int
    refused: bool
    stage_free_in_s: float
    horizon_s: float | None
    generation_s: float | None
    active: int
