"""The interleaving controller contract: ``UMMAdapter`` (its pipelines' config base:
``pipeline.umm_config.UMMPipelineConfig``) and the
model-agnostic ``UMMController`` that drives any adapter.

The controller knows no model. Per request it asks the adapter for a ``Step``: outputs to emit
now and the next ``Dispatch`` (a payload for a stage), or none and a finish reason. It runs each
dispatch on its stage, hands the result back to the adapter, and repeats. It owns the limits
(``max_dispatches``, ``max_outputs``, ``max_retained_bytes``, ``timeout_s``), numbers the segments,
and turns outputs into segments. Each dispatch carries a fresh token that its result must
echo (enforced by the stage handle), so a stale, duplicated or forged result never advances a
request. The adapter owns prompts, the decision format, media conversion and modality rules.

See ``docs/umm-controller.md`` for the contract with a worked example.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sglang_omni.config.stages import MiB
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import (
    BadRequest,
    OmniError,
    RequestTimeout,
    ServerError,
    is_client_error,
)
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.pipeline.json_size import json_size
from sglang_omni.pipeline.timeline import Timeline

TEXT, IMAGE, VIDEO = "text", "image", "video"
_T = TypeVar("_T")


# --- what adapters exchange with the controller -------------------------------------------------
#: A checked client request: the wire's :class:`~sglang_omni.pipeline.chat_request.ChatRequest`
#: itself (``rid`` the claimed request id, ``messages`` the client's conversation, the dicts the
#: client's, by stage name, ``response_format`` the client's (None: unset; the adapter judges
#: it), ``media_policy``, ``history_size`` and ``waited_s`` set by admission). One object from
#: the route to the adapter: nothing copies its fields.
UMMRequest = ChatRequest


@dataclass(frozen=True)
class Dispatch:
    """Work for one stage. ``modality`` names the media a generation dispatch makes. The built-in
    engines take the payloads of ``contract.payloads``."""

    stage: str
    payload: Mapping[str, Any]
    frames: Frames = field(default_factory=list)
    modality: str | None = None


@dataclass(frozen=True)
class DispatchReceipt:
    """The planned queue's answer to a generation it will not run (a value, not an exception):
    ``PlannedGenerations.generation`` returns it instead of the generation's result, and the
    ``StageCall`` turns it into ``StageResult({}, [], stage=stage, receipt=message)``."""

    message: str


@dataclass(frozen=True)
class Output:
    """Something the client receives: text, or media bytes with their MIME type."""

    kind: str
    text: str | None = None
    data: bytes | bytearray | None = None
    mime_type: str | None = None

    @property
    def size(self) -> int:
        """Bytes the output takes as it is delivered: media as base64, text as UTF-8."""
        if self.data is not None:
            return 4 * math.ceil(len(self.data) / 3)
        return len((self.text or "").encode())


@dataclass(frozen=True)
class Step:
    """The adapter's answer: emit ``outputs``, then run ``dispatch``, or finish."""

    outputs: tuple[Output, ...] = ()
    dispatch: Dispatch | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class Budget:
    """What the request may still spend.

    ``generations_left``: generations that still fit if the next dispatch is a generation
    (each needs a Reasoner turn after it), within the generation limit.
    ``planned_generations``: what the deadline plan leaves the request (None: no plan applies).
    """

    dispatches_left: int
    generations_left: int
    planned_generations: int | None = None

    def offered_generations(self, before_reasoner_turn: bool = True) -> int:
        """Generations to offer in a Reasoner turn dispatched now (the turn itself costs one
        dispatch), capped by the plan."""
        fit = self.generations_left
        if before_reasoner_turn:
            fit = min(fit, max(0, (self.dispatches_left - 1) // 2))
        if self.planned_generations is not None:
            fit = min(fit, self.planned_generations)
        return max(0, fit)


class UMMAdapter(Protocol):
    """One instance per request. ``start`` checks the request (raise BadRequest before any model
    work) and returns the first step; ``advance`` takes the result of the last dispatch
    (``result.stage`` names its stage; ``result.receipt`` is set when it was not run);
    ``usage`` reports token counts; ``close`` frees what the request held. Raise an OmniError to
    fail the request."""

    def start(self, request: UMMRequest, budget: Budget) -> Step: ...

    def advance(self, result: StageResult, budget: Budget) -> Step: ...

    def usage(self) -> dict[str, int]: ...

    def close(self) -> None: ...


# --- the controller ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    max_dispatches: int = 17
    max_outputs: int = 17
    max_retained_bytes: int = 128 * MiB
    timeout_s: float = 3600.0

    @classmethod
    def from_factory(cls, factory: dict[str, Any]) -> Limits:
        return cls(factory["max_dispatches"], factory["max_outputs"],
                   factory["max_retained_bytes"], float(factory["timeout_s"]))


@dataclass(frozen=True)
class Segment:
    """An accepted output. Media bytes are held raw; the wire (``serve.umm_wire``) encodes
    them."""

    execution_id: str
    segment_index: int
    kind: str
    text: str | None = None
    media: bytes | bytearray | None = None
    mime_type: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Complete:
    finish_reason: str
    segments: tuple[Segment, ...]
    usage: dict[str, int]

    @property
    def content_bytes(self) -> int:
        """What the segments hold: text characters and raw media bytes."""
        return sum(len(s.text or "") + len(s.media or b"") for s in self.segments)


StageCall = Callable[[str, str, Mapping[str, Any], Frames], Awaitable[StageResult]]
"""``call(stage, rid, payload, frames)``: run a dispatch and return the stage's result (its
``stage`` set, as ``StageHandle.call`` sets it); cancelling it aborts the job. A result with
``receipt`` set answers a generation the deadline plan no longer allows (it was not run)."""


class UMMController:
    """Drives one adapter per request; see the module docstring."""

    def __init__(self, adapter_factory: Callable[[], UMMAdapter], limits: Limits,
                 call: StageCall, max_generations: int = 8,
                 clock: Callable[[], float] = time.monotonic,
                 largest_output_bytes: int = 0,
                 planned: Callable[[str], int | None] | None = None) -> None:
        """``largest_output_bytes``: what ``limits.max_dispatches`` can produce at most; a
        request whose history leaves less room than that is refused before any turn.
        ``planned(rid)``: the generations the deadline plan still allows (None: no plan)."""
        self.adapter_factory = adapter_factory
        self.limits = limits
        self.call = call
        self.max_generations = max_generations
        self.clock = clock
        self.largest_output_bytes = largest_output_bytes
        self.planned = planned or (lambda rid: None)

    def open(self, request: UMMRequest) -> UMMRun:
        """Check the request through the adapter's ``start`` (BadRequest before any model work)
        and return the run, whose ``events()`` drive it."""
        history = request.history_size
        if history is None:
            history = history_bytes(request.messages)
        room = self.limits.max_retained_bytes - self.largest_output_bytes
        if history > room:
            raise BadRequest(
                f"messages: the chat history takes {history} bytes, but only {max(room, 0)} are "
                f"left beside the largest output of max_dispatches="
                f"{self.limits.max_dispatches} within stages.orchestrator.factory."
                "max_retained_bytes; send a shorter history or smaller media"
            )
        adapter = self.adapter_factory()
        state = _RunState(request.rid, self.limits, self.max_generations,
                          lambda: self.planned(request.rid))
        state.retained = history
        try:
            step = adapter.start(request, state.budget())
        except BaseException:
            adapter.close()
            raise
        return UMMRun(self, request, adapter, state, step,
                      self.clock() - request.waited_s + self.limits.timeout_s)


def _sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def history_bytes(messages: list[dict[str, Any]]) -> int:
    """Bytes the orchestrator holds for a client history (its JSON, inline media included)."""
    return json_size(messages)


class UMMRun:
    """One request being driven; iterate ``events()`` once."""

    def __init__(self, controller: UMMController, request: UMMRequest, adapter: UMMAdapter,
                 state: _RunState, first: Step, deadline: float) -> None:
        self.controller = controller
        self.request = request
        self.adapter = adapter
        self.state = state
        self.first = first
        self.deadline = deadline

    def close(self) -> None:
        self.adapter.close()

    async def events(self) -> AsyncIterator[Segment | Complete]:
        """Yield segments as they are accepted, then ``Complete``; errors are OmniErrors.

        Closing the iterator (client gone) cancels the running dispatch, which aborts it on its
        stage; nothing is emitted after that.
        """
        ctl, state, adapter = self.controller, self.state, self.adapter
        step = self.first
        call: asyncio.Future[StageResult] | None = None
        try:
            while True:
                for output in step.outputs:
                    yield await self._segment(output)
                if step.dispatch is None:
                    yield Complete(step.finish_reason or "stop", tuple(state.segments),
                                   adapter.usage())
                    return
                dispatch = state.count(step.dispatch)
                call = asyncio.ensure_future(ctl.call(dispatch.stage, self.request.rid,
                                                      dispatch.payload, dispatch.frames))
                failure: OmniError | None = None
                try:
                    result = await self._within(call)
                    if result.receipt is not None:
                        # Not run, whatever the adapter assumed its allowance was: it gets the
                        # receipt (the generation is not counted; the dispatch is, so an
                        # adapter that keeps asking still ends within max_dispatches).
                        state.uncount_generation(dispatch)
                except OmniError as exc:
                    if not is_client_error(exc.status):
                        raise  # a server fault (out of GPU memory...): fail now, cancel the rest
                    failure = exc
                call = None
                if failure is not None:
                    raise failure
                state.timeline.add(result.stage, result.spans)
                state.hold(json_size(result.payload))
                step = adapter.advance(result, state.budget())
        finally:
            try:
                await _cancel_all([call] if call is not None else [])
            finally:
                adapter.close()

    async def _segment(self, output: Output) -> Segment:
        """Accept ``output`` as the next segment (its digest computed off the event loop)."""
        digest = None if output.data is None else \
            await asyncio.to_thread(_sha256, output.data)
        return self.state.accept(output, digest)

    async def _within(self, work: Awaitable[_T]) -> _T:
        """Await ``work`` within the request's deadline (RequestTimeout past it)."""
        remaining = self.deadline - self.controller.clock()
        if remaining <= 0:
            if isinstance(work, asyncio.Future):
                work.cancel()
            elif asyncio.iscoroutine(work):
                work.close()
            raise _timeout(self.controller.limits.timeout_s)
        try:
            async with asyncio.timeout(remaining):
                return await work
        except TimeoutError:
            raise _timeout(self.controller.limits.timeout_s) from None


async def _cancel_all(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each ended (a stage call's abort reached its stage)."""
    running = [t for t in tasks if not t.done()]
    for task in running:
        task.cancel()
    if running:
        await asyncio.gather(*running, return_exceptions=True)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the request's own error is what it reports


def _timeout(timeout_s: float) -> RequestTimeout:
    return RequestTimeout(
        f"the request outlived stages.orchestrator.factory.timeout_s ({timeout_s:g} s) and was "
        "stopped; raise timeout_s or ask for fewer generations"
    )


class _RunState:
    """Per-request counters the controller enforces."""

    def __init__(self, rid: str, limits: Limits, max_generations: int,
                 planned: Callable[[], int | None]) -> None:
        self.rid = rid
        self.planned = planned
        self.limits = limits
        self.max_generations = max_generations
        self.dispatches = 0
        self.generations = 0
        self.retained = 0
        self.segments: list[Segment] = []
        self.timeline = Timeline()

    def budget(self) -> Budget:
        dispatches_left = self.limits.max_dispatches - self.dispatches
        return Budget(dispatches_left, max(0, min(self.max_generations - self.generations,
                                                  dispatches_left // 2)), self.planned())

    def count(self, dispatch: Dispatch) -> Dispatch:
        if self.dispatches >= self.limits.max_dispatches:
            raise ServerError(
                f"the request needed more than stages.orchestrator.factory.max_dispatches "
                f"({self.limits.max_dispatches}) stage dispatches and was stopped"
            )
        self.dispatches += 1
        if dispatch.modality is not None:
            self.generations += 1
        return dispatch

    def uncount_generation(self, dispatch: Dispatch) -> None:
        """A generation dispatch answered by a receipt ran nothing."""
        if dispatch.modality is not None:
            self.generations -= 1

    def hold(self, size: int) -> None:
        """Count ``size`` more bytes held for the request; ServerError past the limit."""
        self.retained += size
        if self.retained > self.limits.max_retained_bytes:
            raise ServerError(f"the request holds more than stages.orchestrator.factory."
                              f"max_retained_bytes ({self.limits.max_retained_bytes}) bytes")

    def accept(self, output: Output, sha256: str | None = None) -> Segment:
        if len(self.segments) >= self.limits.max_outputs:
            raise ServerError(f"the request produced more than stages.orchestrator.factory."
                              f"max_outputs ({self.limits.max_outputs}) outputs")
        self.hold(output.size)
        if output.kind == TEXT:
            segment = Segment(self.rid, len(self.segments), TEXT, text=output.text or "")
        else:
            assert output.data is not None
            segment = Segment(self.rid, len(self.segments), output.kind, media=output.data,
                              mime_type=output.mime_type,
                              sha256=sha256 or _sha256(output.data))
        self.segments.append(segment)
        return segment
