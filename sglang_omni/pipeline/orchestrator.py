"""The orchestrator: owns every request's state in the server process and drives the stages.

Stage processes are executors; the orchestrator starts them, hands out request ids, applies the
media policy and admission (``pipeline.admission``), and routes each request by the pipeline's
mode: interleaved requests are run by the UMM controller, direct ones by ``pipeline.direct``.
When any stage process dies, every admitted interleaved request fails at once with
``StageDied``, whichever stage it is waiting on (a Reasoner turn, the generation queue or a
generation). Server shutdown ends the requests still running the same way, after its grace
period (:meth:`Orchestrator.drain`): each fails with ``ShuttingDown`` (503), its job aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from sglang_omni.aio.race import race
from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.contract.generation_options import denoising_steps, positive_int
from sglang_omni.contract.job import EngineSpec
from sglang_omni.contract.payloads import REASONER_OPTION_FIELDS, ReasonerOptions, ReasonerPayload
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import (
    ConfigError,
    NeedsRestart,
    OmniError,
    ServiceUnavailable,
    ShuttingDown,
    StageDied,
    StageRestarting,
)
from sglang_omni.media import MediaPolicy
from sglang_omni.media.refs import GENERATION_MEDIA_KEYS
from sglang_omni.media.settings import policy_from_spec
from sglang_omni.pipeline.admission import ChatAdmission, MediaBudget, check_max_active
from sglang_omni.pipeline.admission.media_budget import refs_worst_case, worst_case_bytes
from sglang_omni.pipeline.chat_request import ChatRequest, merged_sampling, sampling_layers
from sglang_omni.pipeline.direct import DirectGenerations
from sglang_omni.pipeline.observe import NoObserver, PipelineObserver
from sglang_omni.pipeline.progress import RunProgress
from sglang_omni.pipeline.reasoner_media import ReasonerMedia
from sglang_omni.pipeline.request_state import Doom, RequestState, RequestStates
from sglang_omni.pipeline.scheduling import PlannedGenerations
from sglang_omni.pipeline.stages import StageSet, media_settings
from sglang_omni.pipeline.streams import stream_call
from sglang_omni.pipeline.timeline import dispatch_spans
from sglang_omni.pipeline.umm import (
    DispatchReceipt,
    Limits,
    UMMController,
    UMMRequest,
    UMMRun,
)
from sglang_omni.pipeline.umm_config import UMMPipelineConfig
from sglang_omni.runtime.request_ids import RequestIds
from sglang_omni.runtime.stage.handle import StageHandle

log = logging.getLogger("sglang_omni.orchestrator")


def media_policy(config: ResolvedConfig) -> MediaPolicy:
    """The media policy of ``config``; ConfigError naming the key when it is invalid."""
    local = config.allowed_local_media_path
    try:
        return policy_from_spec(media_settings(config))
    except ValueError as exc:
        key = "allowed_local_media_path" if local and str(local) in str(exc) \
            else "allowed_media_domain"
        raise ConfigError(f"{key}: {exc}") from None


class Orchestrator:
    """Routes requests to stages. Start with ``start()``, stop with ``stop()``."""

    def __init__(self, config: ResolvedConfig, log_level: str = "info",
                 log_format: str = "text") -> None:
        self.config = config
        self.pipeline = config.pipeline()
        self.mode = self.pipeline.mode
        self.policy = media_policy(config)
        #: Client media bytes the running requests hold (``server.max_client_media_bytes``).
        self.media_budget = MediaBudget(config.server.max_client_media_bytes)
        self.media_budget.on_refused = lambda: self.observer.refused("media_budget")
        self.stages = StageSet(config, log_level, log_format)
        self.ids = RequestIds()
        #: Every request's state (``pipeline.request_state``): opened by :meth:`request`,
        #: released by :meth:`_release` when its ``async with`` ends, and only then.
        self.states = RequestStates(self._release, self.end_admission)
        #: Told about turn and generation times and admission refusals (the server's metrics).
        self.observer: PipelineObserver = NoObserver()
        #: True from construction until every stage answered ready once (``/health`` then says
        #: ``starting``); see :meth:`start`.
        self.starting = True
        self.controller: UMMController | None = None
        self.chat_admission: ChatAdmission | None = None
        if self.mode == "chat":
            self.chat_admission = ChatAdmission.from_engine(
                "reasoner", config.stage("reasoner").engine)
        #: The direct routes' door to the generation stage (direct generation only).
        self.direct = DirectGenerations(self) if self.mode == "generation" else None
        #: Set when a stage whose engine stops the server on exit died; ``on_fatal`` (set by
        #: ``serve.startup``) then stops the server, which exits non-zero.
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[], None] | None = None
        #: True once the server began shutting down (:meth:`drain`): new requests get 503.
        self.stopping = False
        for handle in self.stages.handles.values():
            handle.death_listeners.append(self._on_stage_death)
        if issubclass(self.pipeline, UMMPipelineConfig):
            factory = config.stage("orchestrator").factory
            self.limits = Limits.from_factory(factory)
            self.max_active = int(factory["max_active"])
            # the plan offers no generation max_dispatches cannot run (the demo's 3: one)
            generations = self.pipeline.generations_within(self.limits.max_dispatches)
            self.scheduler = PlannedGenerations(
                self.limits.timeout_s, generations,
                on_fail_fast=lambda: self.observer.refused("deadline"),
                preempt=self._stage_pauses())
            self.controller = UMMController(
                self.pipeline.adapter_cls, self.limits, self._call, generations,
                largest_output_bytes=self.pipeline.largest_output_bytes(
                    self.limits.max_dispatches),
                planned=self.scheduler.allowance)

    async def start(self) -> None:
        """Start every stage; ``starting`` is False once they all answered ready (it stays
        True when one failed, and the server then stops)."""
        await self.stages.start()
        self.starting = False

    async def stop(self) -> None:
        try:
            if self.controller is not None:  # the interleaved pipeline: it has a scheduler
                await self.scheduler.close()
        finally:
            await self.stages.stop()

    async def drain(self, grace_s: float) -> None:
        """Server shutdown (SIGTERM, SIGINT): refuse new requests with 503 from now on, let
        those in flight run ``grace_s`` seconds, then :meth:`end_in_flight`."""
        self.stopping = True
        requests, jobs = self.in_flight
        if requests or jobs:
            log.info("shutting down: new requests get 503; %d request(s) and %d stage job(s) "
                     "in flight may run %g s more", requests, jobs, grace_s)
        else:
            log.info("shutting down: nothing in flight; new requests get 503")
        await asyncio.sleep(grace_s)
        self.end_in_flight()

    def end_in_flight(self) -> None:
        """End every request still running with ShuttingDown (503), as a stage death fails
        them: each stage's calls fail and their jobs are aborted (later calls fail at once),
        and every admitted interleaved request fails wherever it waits."""
        def shutting_down(_rid: str) -> ShuttingDown:
            return ShuttingDown()

        calls = sum(h.end_calls(shutting_down) for h in self.stages.handles.values())
        admitted = self.admitted
        if calls or admitted:
            log.warning("shutting down: ending %d stage call(s) and %d interleaved request(s) "
                        "still running with 503", calls, admitted)
        self._fail_admitted(shutting_down)

    def _stage_pauses(self) -> bool:
        """Whether the generation stage pauses a younger request's job for an older one's: its
        engine offers denoising step boundaries (the scripted generator, the hf backend's fast
        loop: not its stock ``__call__``, the CPU's default, nor native generation) and its
        ``pause_budget_bytes`` is positive."""
        def pauses(spec: EngineSpec) -> bool:
            if spec.backend == "hf":
                denoiser = spec.engine.get("denoiser", "auto")
                return denoiser == "fast" or (denoiser == "auto" and spec.gpu is not None)
            return spec.backend != "native"

        return all(pauses(h.spec) and h.spec.factory.get("pause_budget_bytes") != 0
                   for h in self.stages.handles.values() if h.spec.role == "generation")

    @property
    def healthy(self) -> bool:
        return self.stages.healthy

    def _on_stage_death(self, handle: StageHandle) -> list[str]:
        """Fail the requests that depend on ``handle`` (their ids: the stage counts them)."""
        failed = self._fail_dependents(handle)
        if not handle.stops_server_on_exit or self.fatal_error is not None:
            return failed
        reason = handle.fatal_message or f"exit code {handle.exitcode}"
        self.fatal_error = f"the {handle.name} stage exited ({reason})"
        log.error("%s; its native SGLang processes are gone, so the server stops",
                  self.fatal_error)
        if self.on_fatal is not None:
            self.on_fatal()
        return failed

    def health(self) -> dict[str, Any]:
        """The ``/health`` body: ``status`` is ``ok``, ``starting`` (the stages are loading),
        ``stalled`` or ``restarting`` (a stage is coming back by itself) or ``unhealthy``; per
        stage its status, pid, exit code, restarts so far, the seconds until its planned restart
        (while it is restarting), its last fault and its device memory at its last heartbeat."""
        stages = {n: {"status": h.status, "pid": h.pid, "exitcode": h.exitcode,
                      "restarts": self.stages.supervisors[n].restarts,
                      "restart_in_s": self._restart_in_s(n),
                      "last_fault": h.last_fault, "gpu_memory": h.gpu_memory}
                  for n, h in self.stages.handles.items()}
        statuses = {s["status"] for s in stages.values()}
        if statuses == {"ready"}:
            status = "ok"
        elif self.starting and statuses <= {"ready", "starting"}:
            status = "starting"
        elif statuses <= {"ready", "stalled", "restarting"}:
            status = "stalled" if "stalled" in statuses else "restarting"
        else:
            status = "unhealthy"
        return {"status": status, "stages": stages}

    def _restart_in_s(self, stage: str) -> float | None:
        """Seconds until ``stage``'s planned restart, to 0.1 s; None unless it is restarting."""
        wait = self.stages.supervisors[stage].restart_in_s()
        return None if wait is None else round(wait, 1)

    def _fail_dependents(self, handle: StageHandle) -> list[str]:
        """Interleaved requests use every stage: fail them all now (the planner releases
        them when their runs end); the ids of those failed."""
        after = "it is restarting; retry shortly" if handle.restarting \
            else "the server is unhealthy and needs a restart"
        return self._fail_admitted(lambda rid: StageDied(
            f"the {handle.name} stage {handle.exit_cause} while request {rid} was in flight; "
            f"{after}"))

    def _fail_admitted(self, error_of: Callable[[str], OmniError]) -> list[str]:
        """Fail every admitted interleaved request with ``error_of(rid)`` (its dispatch in
        progress is cancelled, its next one raises); the ids of those not failed before."""
        failed = []
        for state in self.states:
            if state.doom is not None and state.rid is not None:
                if state.doom.error is None:
                    failed.append(state.rid)
                state.doom.fail(error_of(state.rid))
        return failed

    def check_healthy(self) -> None:
        """ServiceUnavailable (503) unless every stage is ready; StageRestarting while the
        stages that are down are being restarted, ShuttingDown once the server is stopping."""
        if self.stopping:
            raise ShuttingDown()
        if self.healthy:
            return
        self.observer.refused("stage_down")
        down = [h for h in self.stages.handles.values() if not h.healthy]
        names = ", ".join(h.name for h in down)
        if self.starting and all(h.status in ("starting", "ready") for h in down):
            raise StageRestarting(f"the server is starting: stage(s) {names} are still loading; "
                                  "retry when GET /health answers ok")
        if all(h.restarting or h.stalled for h in down):
            waits = [w for h in down if (w := self._restart_in_s(h.name)) is not None]
            wait = max(waits, default=None)
            when = f"retry in {wait:.0f} s" if wait else "retry in a few seconds"
            raise StageRestarting(f"stage(s) {names} exited or stopped answering and are "
                                  f"restarting; {when}", retry_after_s=wait)
        raise NeedsRestart(f"stage(s) {names} are not running; the server is unhealthy and "
                           "needs a restart (retry on another server)")

    async def _call(self, stage: str, rid: str, payload: Mapping[str, Any],
                    frames: Frames) -> StageResult:
        """Run a controller dispatch; generations go through the planned queue. Fails with
        StageDied as soon as any stage dies while the request is admitted."""
        handle = self.stages[stage]
        state = self.states.get(rid)
        progress = (state.progress if state is not None else None) or RunProgress()
        observer = self.observer
        called = time.monotonic()

        def timed(result: StageResult, started: float) -> StageResult:
            """``result`` with its dispatch's spans (``pipeline.timeline``)."""
            spans = dispatch_spans(result.spans, result.engine_s, started - called,
                                   time.monotonic() - started)
            progress.dispatch_ended(handle.spec.role, spans)
            return replace(result, spans=spans)

        if handle.spec.role == "generation":
            modality = str(payload.get("modality", "image"))
            ran_steps = denoising_steps(payload.get("options"))
            paused_s = 0.0  # the seconds the stage kept the job waiting for older ones
            order = self.scheduler.admitted_at(rid)

            async def run() -> StageResult:  # called once the stage is this request's
                on_progress = progress.generation_started(modality, ran_steps)

                def on_chunk(chunk: dict[str, Any]) -> None:
                    nonlocal ran_steps  # the stage says how many steps it runs
                    ran_steps = positive_int(chunk.get("steps")) or ran_steps
                    on_progress(chunk)

                nonlocal paused_s
                started = time.monotonic()
                result = await handle.call(rid, payload, frames, on_chunk=on_chunk,
                                           order=order)
                paused_s = result.spans.get("paused", 0.0)
                observer.generation(modality, time.monotonic() - started - paused_s)
                return timed(result, started)

            planned = await self._unless_doomed(
                state, self.scheduler.generation(rid, modality, run, lambda: ran_steps,
                                                 lambda: paused_s))
            if isinstance(planned, DispatchReceipt):  # not run: the adapter hears why
                return StageResult({}, [], stage=stage, receipt=planned.message)
            return planned
        else:
            media = state.media if state is not None else None

            async def run() -> StageResult:
                progress.turn_started()
                started = time.monotonic()
                if media is None:
                    result = await handle.call(rid, payload, frames)
                else:
                    turn = await media.prepare(handle, payload, frames)
                    result = await handle.call(rid, turn.payload, turn.frames, media=turn.media)
                    media.sent(handle, turn)
                observer.reasoner_turn(time.monotonic() - started)
                return timed(result, started)

            work = self.scheduler.reasoner_turn(rid, run)
        result: StageResult = await self._unless_doomed(state, work)
        return result

    async def _unless_doomed(self, state: RequestState | None, work: Any) -> Any:
        """Await ``work`` unless a stage dies first; then cancel it and raise StageDied."""
        doom = state.doom if state is not None else None
        if doom is None:
            return await work
        if doom.error is not None:
            work.close()
            raise doom.error
        try:
            finish = await race(work, doom.event.wait())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if doom.error is not None and task is not None and not task.cancelling():
                raise doom.error from None  # the work was cancelled as the stage died
            raise
        if finish.index == 1:
            assert doom.error is not None
            raise doom.error
        return finish.value

    # --- requests ----------------------------------------------------------------------------
    def request(self) -> RequestState:
        """A new request's state: ``async with`` it around everything the request does (the
        HTTP layer: the route and its response); its exit is the request's one release."""
        return self.states.hold()

    @property
    def in_flight(self) -> tuple[int, int]:
        """``(requests, stage jobs)`` running now: requests with an id and no answer sent yet
        (a poll of /health has no id), and the jobs the stages hold (a video job runs on after
        its answer)."""
        requests = sum(1 for state in self.states if state.rid is not None
                       and not state.answered)
        return requests, sum(handle.open_jobs for handle in self.stages.handles.values())

    @property
    def admitted(self) -> int:
        """Interleaved requests admitted and not yet answered (at most ``max_active``)."""
        return sum(1 for state in self.states if state.run is not None and not state.answered)

    def claim(self, state: RequestState, client_rid: object = None) -> str:
        """Claim the request id (``client_rid``, or a fresh one; 400 when it is taken) for
        ``state``; it ends with the state's release (set ``state.refused`` when the request was
        refused before any work: the id is free again)."""
        rid = self.ids.claim(client_rid)
        state.claim(rid)
        return rid

    def end_admission(self, state: RequestState) -> None:
        """End what counts ``state`` against admission: its ticket, its place in the deadline
        plan and its client media bytes (idempotent). Run as its response's last byte goes out
        (or its direct generation ended), and again by its release."""
        if state.ticket is not None:
            state.ticket.release()
        if state.media_hold is not None:
            state.media_hold.release()
        if state.plan is not None and state.rid is not None:
            self.scheduler.release(state.rid)

    def _release(self, state: RequestState) -> None:
        """Undo what ``state`` holds (``RequestStates`` calls it once, when the request's
        ``async with`` ends; its streams are closed by then)."""
        rid = state.rid
        try:
            if state.run is not None:
                state.run.close()
            if state.media is not None:
                state.media.close()
            if state.media_hold is not None:
                state.media_hold.release()
            if rid is not None and (state.run is not None or state.on_reasoner):
                self._end_on_reasoners(rid)
        finally:
            self.end_admission(state)  # the ticket and the plan place, if not ended already
            if rid is not None:
                if state.refused:
                    self.ids.forget(rid)  # the client may retry with the same rid
                else:
                    self.ids.finish(rid)  # the rid stays taken for a while

    def admit_text_chat(self, state: RequestState, messages: Any = ()) -> None:
        """Admit a text-only chat request (503 beyond the native limits' sum, or when the most
        its client media ``messages`` may take does not fit in the client media budget: the
        Reasoner stage reads them and keeps them until the request ends); its ticket and its
        reservation are ``state``'s, released with it."""
        self.check_healthy()
        if self.chat_admission is not None:
            try:
                state.take(self.chat_admission.enter())
            except ServiceUnavailable:
                self.observer.refused("chat_queue")
                raise
        state.media_hold = self.media_budget.reserve(worst_case_bytes(messages, self.policy))

    async def text_chat(self, state: RequestState, req: ChatRequest
                        ) -> AsyncGenerator[dict[str, Any] | StageResult, None]:
        """One Reasoner completion of the claimed request ``state``: yields ``{"text": delta}``
        chunks, then the StageResult."""
        assert state.rid is not None
        self.check_healthy()
        payload: ReasonerPayload = {
            "messages": req.messages,
            # top level < stage_sampling.reasoner here; stage_params.reasoner wins in the engine
            "sampling": merged_sampling(sampling_layers(
                req.sampling, req.stage_sampling, req.stage_params)[:2]),
            "stage_params": req.stage_params.get("reasoner", {}),
            "response_format": req.response_format,
            "stream": req.stream,
            "turn_index": 0,
            "options": cast(ReasonerOptions, {k: req.extra[k] for k in REASONER_OPTION_FIELDS
                                              if k in req.extra}),
        }
        state.on_reasoner = True  # the stages release its context when the state is released
        async for item in stream_call(self.stages["reasoner"], state.rid, payload):
            yield item

    def _end_on_reasoners(self, rid: str) -> None:
        """Tell the Reasoner stages ``rid`` ended (they release its context)."""
        for handle in self.stages.handles.values():
            if handle.spec.role == "reasoner":
                handle.end_request(rid)

    def open_interleaved(self, state: RequestState, request: UMMRequest) -> UMMRun:
        """Check and admit the interleaved request of the claimed ``state`` (400 or 503
        before any model work); the run, its plan, progress and media are ``state``'s,
        released with it. Iterate ``run.events()`` (through ``state.closes``) to drive it."""
        assert self.controller is not None and state.rid == request.rid
        self.check_healthy()
        check_max_active(self.admitted, self.max_active, self.observer.refused)
        # the generation stage reads stage_params' image_path/video_path for the whole request
        generation_refs = refs_worst_case(self._generation_refs(request), self.policy)
        state.media_hold = self.media_budget.reserve(
            worst_case_bytes(request.messages, self.policy) + generation_refs)
        run = self.controller.open(request)
        try:
            plan = self.scheduler.admit(request.rid, request.waited_s,
                                        self._asked_steps(request))
        except BaseException as exc:
            run.close()
            if isinstance(exc, ServiceUnavailable):
                self.observer.refused("plan")
            raise
        state.run, state.plan = run, plan
        state.doom, state.progress = Doom(), RunProgress()
        state.media = ReasonerMedia(request.rid, self.policy, state.media_hold,
                                    also_held=generation_refs)
        return run

    def _generation_refs(self, request: UMMRequest) -> list[str]:
        """The media references of ``request``'s ``stage_params`` for its generation stages
        (``image_path``/``video_path``: the stage reads them for each generation)."""
        refs: list[str] = []
        for name, handle in self.stages.handles.items():
            params = request.stage_params.get(name)
            if handle.spec.role != "generation" or not isinstance(params, Mapping):
                continue
            for key in GENERATION_MEDIA_KEYS:
                value = params.get(key)
                refs += [v for v in (value if isinstance(value, list) else [value])
                         if isinstance(v, str)]
        return refs

    def _asked_steps(self, request: UMMRequest) -> int | None:
        """The denoising steps ``request`` asks of its generations (``stage_params`` of the
        generation stage), None for the engine's default."""
        for name, handle in self.stages.handles.items():
            if handle.spec.role == "generation":
                return denoising_steps(request.stage_params.get(name))
        return None
