"""The set of stage processes a pipeline runs, started and stopped together, each watched by
its ``StageSupervisor`` (restart on exit, heartbeat)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.contract.job import EngineSpec
from sglang_omni.runtime.stage.handle import StageHandle
from sglang_omni.runtime.supervisor import RestartPolicy, StageSupervisor

log = logging.getLogger("sglang_omni.runtime")


def media_settings(config: ResolvedConfig) -> dict[str, Any]:
    """The media policy's settings of ``config``, as plain values a stage process receives
    (:func:`~sglang_omni.media.settings.policy_from_spec` builds the policy from them, in the
    server and in every stage)."""
    return {"allowed_local_media_path": config.allowed_local_media_path,
            "allowed_media_domain": list(config.allowed_media_domain),
            "max_media_parts": config.server.max_media_parts,
            "max_media_bytes": config.server.max_media_bytes,
            "fetch_timeout_s": config.server.media_fetch_timeout_s,
            "fetch_deadline_s": config.server.media_fetch_deadline_s,
            "request_deadline_s": config.server.media_request_deadline_s}


def engine_spec(config: ResolvedConfig, name: str) -> EngineSpec:
    stage = config.stage(name)
    return EngineSpec(
        stage=name, role=stage.role, backend=stage.backend, model_path=config.model_path,
        gpu=stage.gpu, gpu_memory_fraction=stage.gpu_memory_fraction,
        factory=dict(stage.factory), engine=dict(stage.engine),
        media_policy=media_settings(config),
        umm_adapter=config.pipeline().umm_adapter(),
    )


class StageSet:
    """All process stages of a pipeline, by name."""

    def __init__(self, config: ResolvedConfig, log_level: str = "info",
                 log_format: str = "text") -> None:
        self.handles: dict[str, StageHandle] = {
            s.name: StageHandle(engine_spec(config, s.name),
                                float(s.factory.get("startup_timeout_s", 900)), log_level,
                                log_format)
            for s in config.process_stages()
        }
        self.supervisors: dict[str, StageSupervisor] = {
            s.name: StageSupervisor(self.handles[s.name],
                                    RestartPolicy.from_factory(s.factory, s.role))
            for s in config.process_stages()
        }

    def __getitem__(self, name: str) -> StageHandle:
        return self.handles[name]

    @property
    def healthy(self) -> bool:
        return all(h.healthy for h in self.handles.values())

    def spawn(self) -> None:
        """Start every stage's process now without waiting (``StageHandle.spawn``); ``start()``
        then waits for them. Logs the processes it started."""
        started = [f"{name} (pid {handle.pid})" for name, handle in self.handles.items()
                   if handle.spawn()]
        if started:
            log.info("stage processes started: %s", ", ".join(started))

    async def start(self) -> None:
        """Start every stage at once (their processes all spawn before any is waited for); if
        one fails, stop the others and re-raise."""
        self.spawn()
        results = await asyncio.gather(*(h.start() for h in self.handles.values()),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        for supervisor in self.supervisors.values():
            supervisor.start()
        log.info("all stages ready: %s", ", ".join(self.handles))

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.supervisors.values()))
        await asyncio.gather(*(h.stop() for h in self.handles.values()))
