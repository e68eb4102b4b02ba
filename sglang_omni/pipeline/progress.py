"""Progress of an interleaved request: the Reasoner turn it is on and each generation's steps.

A :class:`RunProgress` per admitted request counts its Reasoner turns and generations (the
orchestrator calls :meth:`RunProgress.turn_started` and :meth:`RunProgress.generation_started`
as dispatches start, and hands each generation step chunk of the stage, ``{"step", "steps"}``,
to the callback the latter returns). A client that asked for progress subscribes
(:meth:`RunProgress.subscribe`) and reads the events beside the run's segments through
:func:`with_progress`; nobody subscribed, nothing is queued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sglang_omni.aio.merge import merge

T = TypeVar("T")
REASONER, GENERATION = "reasoner", "generation"


@dataclass(frozen=True)
class Progress:
    """One progress event. ``turn`` is the Reasoner turn (1 = the first) that is running, or
    that asked for the generation; ``generation`` counts the request's generations (1 = the
    first); ``step`` of ``steps`` are denoising steps done (0 when the generation started;
    ``steps`` None while the engine has not said); ``elapsed_s`` counts from admission.
    ``spans``: set on the event that says a dispatch ended, with where its seconds went
    (``pipeline.timeline``: the engine's spans, ``engine``, ``wait``, ``relay``)."""

    stage: str
    turn: int
    elapsed_s: float
    modality: str | None = None
    generation: int | None = None
    step: int | None = None
    steps: int | None = None
    spans: Mapping[str, float] | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON object clients receive (``event: progress`` / ``delta.progress``)."""
        body: dict[str, Any] = {"stage": self.stage, "turn": self.turn,
                                "elapsed_s": round(self.elapsed_s, 3)}
        if self.stage == GENERATION:
            body.update(modality=self.modality, generation=self.generation, step=self.step,
                        steps=self.steps)
        if self.spans is not None:
            body["spans"] = {name: round(seconds, 3) for name, seconds in self.spans.items()}
        return body


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RunProgress:
    """Counts one request's turns and generations; queues events for a subscriber."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.turns = 0
        self.generations = 0
        self._modality: str | None = None
        self._step: int | None = None  # the latest generation's steps done, of _steps
        self._steps: int | None = None
        self._queue: asyncio.Queue[Progress] | None = None

    def subscribe(self) -> asyncio.Queue[Progress]:
        """The queue of this request's progress events from now on (one subscriber)."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    def _put(self, event: Progress) -> None:
        if self._queue is not None:
            self._queue.put_nowait(event)

    def turn_started(self) -> None:
        self.turns += 1
        self._put(Progress(REASONER, self.turns, self.clock() - self.started))

    def generation_started(self, modality: str, steps: Any = None
                           ) -> Callable[[dict[str, Any]], None]:
        """Count a generation that starts on its stage now; returns the callback for its
        stage chunks (``{"step", "steps"}``; other chunks are ignored)."""
        self.generations += 1
        self._modality, self._step, self._steps = modality, 0, _int_or_none(steps)
        turn, index = self.turns, self.generations
        self._put(Progress(GENERATION, turn, self.clock() - self.started, modality, index, 0,
                           self._steps))

        def on_chunk(chunk: dict[str, Any]) -> None:
            step = _int_or_none(chunk.get("step"))
            if step is None:
                return
            if index == self.generations:
                self._step, self._steps = step, _int_or_none(chunk.get("steps"))
            self._put(Progress(GENERATION, turn, self.clock() - self.started, modality, index,
                               step, _int_or_none(chunk.get("steps"))))

        return on_chunk

    def dispatch_ended(self, stage: str, spans: Mapping[str, float]) -> None:
        """A Reasoner turn (``stage`` reasoner) or the latest generation ended: the event says
        the turn or generation (with its last step) as the others do, and ``spans``."""
        elapsed = self.clock() - self.started
        if stage == GENERATION:
            self._put(Progress(GENERATION, self.turns, elapsed, self._modality,
                               self.generations, self._step, self._steps, spans=dict(spans)))
        else:
            self._put(Progress(stage, self.turns, elapsed, spans=dict(spans)))


def with_progress(events: AsyncIterator[T], queue: asyncio.Queue[Progress]
                  ) -> AsyncGenerator[T | Progress, None]:
    """``events`` with the progress events of ``queue`` in between, as they come (a progress
    event that is ready with the next item of ``events`` comes first). Ends when ``events``
    ends. Closing or cancelling this iterator cancels the pending read of ``events`` and closes
    it (:func:`~sglang_omni.aio.merge.merge`)."""
    return merge(events, queue.get)
