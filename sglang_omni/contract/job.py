"""The job and engine interface: what a stage process hands its engine, and what every backend
implements (``engines/`` holds the backends and ``engines.base.build_engine``).

A stage process holds one engine and no request state. For each request it builds a ``Job`` and
awaits ``engine.run(job)``. An abort sets ``job.cancelled`` and cancels the task running the job,
so an engine stops either at its next ``await`` or, for blocking compute in a thread, at its
next check of ``job.cancelled``.

Liveness comes from progress: an engine calls ``job.progress()`` (from any thread, as often as it
likes; the stage sends at most a few a second) at each sign of life inside a job — a denoising
step, a decoded token batch, a model call's return. A chunk it emits counts as progress too. A
stage holding a job that shows none for its ``progress_timeout_s`` is taken for hung and is
killed and restarted (``runtime.supervisor``).

Step boundaries: on a generation stage a job has a ``turn`` (``contract.gpu_turns``): an engine
calls ``job.step_boundary(kept_bytes)`` (or ``await job.step_boundary_async(...)`` on the event
loop) between two denoising steps, where the job may be paused for an older request's job and
resumed later; it must then continue exactly where it stopped. Without a turn it returns at once.

Payloads by role are typed in ``contract.payloads`` (``ReasonerPayload``, ``GenerationPayload``
and their results and chunks); an engine answers with ``contract.result.StageResult``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_omni.config.model_protocols import DecisionRenderer
from sglang_omni.contract.gpu_turns import Turn
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import BadRequest

FRAME_SCHEME = "omni-frame://"
#: The spans an engine may report for a job (``Job.timed``): the Reasoner's media preparation,
#: prefill and decode; a generation's denoising, VAE decode and media encoding.
#: ``paused``: the time a generation waited for the GPU while older requests' jobs ran (to
#: begin, or paused at a step boundary; ``contract.gpu_turns``), outside ``denoise``.
ENGINE_SPANS = ("media", "prefill", "decode", "denoise", "vae_decode", "encode", "paused")
#: Native chat request fields Omni sets from the request itself; refused under stage_params.
OMNI_OWNED_FIELDS = ("messages", "stream", "stream_options", "rid")


def refuse_omni_owned(where: str, names: Iterable[str]) -> None:
    """BadRequest for the first of ``names`` (fields under ``where``, e.g.
    ``stage_params.reasoner.``) that Omni sets itself: the one refusal of
    :data:`OMNI_OWNED_FIELDS`, at the wire and in the engines."""
    for name in names:
        if name in OMNI_OWNED_FIELDS:
            raise BadRequest(f"{where}{name}: set by Omni from the request; use the top-level "
                             "field and remove it here")


@dataclass
class Job:
    """One request as an engine sees it. ``emit`` is thread-safe and keeps chunk order;
    ``progress`` (thread-safe, cheap) says the engine is still moving on this job."""

    rid: str
    payload: Mapping[str, Any]
    frames: Frames
    emit: Callable[[dict[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    progress: Callable[[], None] = field(default=lambda: None)
    #: Seconds of the job by span (``pipeline.timeline.ENGINE_SPANS``: media, prefill, decode,
    #: denoise, vae_decode, encode), sent with the result; what no span covers is "engine".
    spans: dict[str, float] = field(default_factory=dict)
    #: The job's place in the generation stage's GPU turns (None elsewhere).
    turn: Turn | None = None
    #: Set by the stage when it hands the job to its engine (after the job's GPU turn began, on
    #: a generation stage); a job aborted before that ran no engine code.
    began: bool = False

    def step_boundary(self, kept_bytes: int | None, step: int = 0, steps: int = 0) -> None:
        """Between denoising steps ``step`` and ``step + 1`` of ``steps``, from the engine's
        thread: may pause here for an older request's job (``contract.gpu_turns``), keeping
        ``kept_bytes`` on the device (None: this job cannot pause here)."""
        if self.turn is not None:
            self.turn.boundary(kept_bytes, step, steps)

    async def step_boundary_async(self, kept_bytes: int, step: int = 0, steps: int = 0) -> None:
        """:meth:`step_boundary` for an engine running on the event loop."""
        if self.turn is not None:
            await self.turn.boundary_async(kept_bytes, step, steps)

    @contextmanager
    def timed(self, span: str) -> Iterator[None]:
        """Add the time of the ``with`` block to ``spans[span]`` (from any one thread)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.spans[span] = self.spans.get(span, 0.0) + time.perf_counter() - started

    def frame_for(self, url: str) -> bytes | bytearray | None:
        """The inline bytes an ``omni-frame://N`` url names, or None for other urls."""
        if not url.startswith(FRAME_SCHEME):
            return None
        return self.frames[int(url[len(FRAME_SCHEME):])]


def clean_spans(raw: Any) -> dict[str, float]:
    """The known spans of a stage's ``spans`` report, as non-negative finite seconds (anything
    else is dropped: the names become metric labels)."""
    if not isinstance(raw, Mapping):
        return {}
    spans: dict[str, float] = {}
    for name in ENGINE_SPANS:
        value = raw.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and 0 <= value < float("inf"):
            spans[name] = float(value)
    return spans


class Engine(Protocol):
    """A backend. ``start`` loads the model (before the ready handshake); ``close`` frees it.

    Optional lifecycle hooks (the native backends define them): ``watch()`` completes with a
    message once the engine can no longer serve (a native scheduler or detokenizer process
    failed); the stage then reports ``fatal`` and exits. ``stops_server_on_exit = True`` makes
    the server stop, with a non-zero exit code, whenever this stage process exits. An engine
    that keeps state of a request across its jobs (the hf Reasoner's context) defines
    ``end_request(rid)``, which the stage calls when the server says the request ended and when
    it aborts the request's job, and ``stats()``, a dict of integers sent with every heartbeat
    answer (``StageHandle.engine_stats``). ``startup_parts()``, called once ``start`` returned,
    gives the seconds of the start's parts in turn (e.g. ``imports``, ``weights``, ``warm-up``)
    and of what ran beside them (two dicts), for the stage's ready line.
    """

    async def start(self) -> None: ...

    async def run(self, job: Job) -> StageResult: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """What a stage process needs to build its engine (picklable for spawn)."""

    stage: str
    role: str
    backend: str
    model_path: str | None
    gpu: int | None
    gpu_memory_fraction: float | None
    factory: dict[str, Any]
    engine: dict[str, Any]
    media_policy: dict[str, Any] = field(default_factory=dict)
    #: The pipeline's UMM adapter class (a reasoner serializes decisions in its format, through
    #: ``config.model_protocols.DecisionRenderer``; pickled by reference for spawn); None when
    #: the pipeline has none (text chat, direct generation).
    umm_adapter: DecisionRenderer | None = None
