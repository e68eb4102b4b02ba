"""The orchestrator: owns every request's state in the server process and drives the stages.

Stage processes are executors; the orchestrator starts them, hands out request ids, applies the
media policy and admission, and routes each request by the pipeline's mode. Interleaved
requests are run by the UMM controller.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.errors import ConfigError, ServiceUnavailable
from sglang_omni.media import MediaPolicy
from sglang_omni.pipeline.chat_admission import AdmissionTicket, ChatAdmission
from sglang_omni.pipeline.scheduling import PlannedGenerations
from sglang_omni.pipeline.stages import StageSet
from sglang_omni.pipeline.streams import stream_call
from sglang_omni.pipeline.umm import (
    Complete,
    DispatchResult,
    Limits,
    Segment,
    UMMController,
    UMMPipelineConfig,
    UMMRequest,
    UMMRun,
)
from sglang_omni.runtime.ipc import Frames
from sglang_omni.runtime.request_ids import RequestIds
from sglang_omni.runtime.stage_handle import StageHandle
from sglang_omni.runtime.stage_result import StageResult
from sglang_omni.serve.chat_request import ChatRequest

log = logging.getLogger("sglang_omni.orchestrator")


def media_policy(config: ResolvedConfig) -> MediaPolicy:
    """The media policy of ``config``; ConfigError naming the key when it is invalid."""
    local = config.allowed_local_media_path
    try:
        return MediaPolicy(allowed_local_media_path=Path(local) if local else None,
                           allowed_media_domains=tuple(config.allowed_media_domain))
    except ValueError as exc:
        key = "allowed_local_media_path" if local and str(local) in str(exc) \
            else "allowed_media_domain"
        raise ConfigError(f"{key}: {exc}") from None


class Orchestrator:
    """Routes requests to stages. Start with ``start()``, stop with ``stop()``."""

    def __init__(self, config: ResolvedConfig, log_level: str = "info") -> None:
        self.config = config
        self.pipeline = config.pipeline()
        self.mode = self.pipeline.mode
        self.policy = media_policy(config)
        self.stages = StageSet(config, log_level)
        self.ids = RequestIds()
        self.active: set[str] = set()
        self.controller: UMMController | None = None
        self.chat_admission: ChatAdmission | None = None
        if self.mode == "chat":
            self.chat_admission = ChatAdmission.from_engine(
                "reasoner", config.stage("reasoner").engine)
        #: Set when a stage whose engine stops the server on exit died; ``on_fatal`` (set by
        #: the CLI) then stops the server, which exits non-zero.
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[], None] | None = None
        for handle in self.stages.handles.values():
            handle.death_listeners.append(self._on_stage_death)
        if issubclass(self.pipeline, UMMPipelineConfig):
            factory = config.stage("orchestrator").factory
            self.limits = Limits.from_factory(factory)
            self.max_active = int(factory["max_active"])
            self.scheduler = PlannedGenerations(self.limits.timeout_s,
                                                self.pipeline.max_generations)
            self.controller = UMMController(
                self.pipeline.adapter_cls, self.limits, self._call,
                self.pipeline.max_generations,
                largest_output_bytes=self.pipeline.largest_output_bytes(
                    self.limits.max_dispatches),
                planned=self.scheduler.allowance)

    async def start(self) -> None:
        await self.stages.start()

    async def stop(self) -> None:
        await self.stages.stop()

    @property
    def healthy(self) -> bool:
        return self.stages.healthy

    def _on_stage_death(self, handle: StageHandle) -> None:
        if not handle.stops_server_on_exit or self.fatal_error is not None:
            return
        reason = handle.fatal_message or f"exit code {handle.exitcode}"
        self.fatal_error = f"the {handle.name} stage exited ({reason})"
        log.error("%s; its native SGLang processes are gone, so the server stops",
                  self.fatal_error)
        if self.on_fatal is not None:
            self.on_fatal()

    def check_healthy(self) -> None:
        if not self.healthy:
            dead = [h.name for h in self.stages.handles.values() if not h.healthy]
            raise ServiceUnavailable(f"stage(s) {', '.join(dead)} are not running; the server is "
                                     "unhealthy and needs a restart")

    async def _call(self, stage: str, rid: str, payload: dict[str, Any],
                    frames: Frames) -> DispatchResult:
        """Run a controller dispatch; generations go through the planned queue."""
        handle = self.stages[stage]

        def run() -> Any:
            return handle.call(rid, payload, frames)

        if handle.spec.role == "generation":
            result = await self.scheduler.generation(rid, str(payload.get("modality", "image")),
                                                     run)
        else:
            result = await self.scheduler.reasoner_turn(rid, run)
        return DispatchResult(stage, result.payload, result.frames)

    # --- routes ------------------------------------------------------------------------------
    def admit_text_chat(self) -> AdmissionTicket | None:
        """Admit a text-only chat request (503 beyond the native limits' sum); the caller
        releases the ticket when the request ends."""
        self.check_healthy()
        return self.chat_admission.enter() if self.chat_admission is not None else None

    async def text_chat(self, rid: str, req: ChatRequest
                        ) -> AsyncIterator[dict[str, Any] | StageResult]:
        """One Reasoner completion: yields ``{"text": delta}`` chunks, then the StageResult."""
        self.check_healthy()
        payload = {
            "messages": req.messages,
            # stage_sampling.reasoner outranks the top-level sampling fields
            "sampling": {**req.sampling, **req.stage_sampling.get("reasoner", {})},
            "stage_params": req.stage_params.get("reasoner", {}),
            "response_format": req.response_format,
            "stream": req.stream,
            "turn_index": 0,
            "umm_adapter": None,
            "options": {k: req.extra[k] for k in ("logprobs", "top_logprobs") if k in req.extra},
        }
        async for item in stream_call(self.stages["reasoner"], rid, payload):
            yield item

    def open_interleaved(self, request: UMMRequest) -> UMMRun:
        """Check and admit an interleaved request (400 or 503 before any model work).

        The caller must iterate ``run.events()`` through ``interleaved_events`` or call
        ``release(rid)``.
        """
        assert self.controller is not None
        self.check_healthy()
        if len(self.active) >= self.max_active:
            raise ServiceUnavailable(
                f"the server is at stages.orchestrator.factory.max_active ({self.max_active}) "
                "requests; retry later"
            )
        run = self.controller.open(request)
        try:
            self.scheduler.admit(request.rid)
        except BaseException:
            run.close()
            raise
        self.active.add(request.rid)
        return run

    def release(self, rid: str) -> None:
        self.active.discard(rid)
        if self.controller is not None:
            self.scheduler.release(rid)

    async def interleaved_events(self, run: UMMRun) -> AsyncIterator[Segment | Complete]:
        """Drive an admitted run; releases its admission when the iterator ends."""
        try:
            async for event in run.events():
                yield event
        finally:
            run.close()
            self.release(run.request.rid)
