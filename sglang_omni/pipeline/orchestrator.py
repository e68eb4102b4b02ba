"""The orchestrator: owns every request's state in the server process and drives the stages.

Stage processes are executors; the orchestrator starts them, hands out request ids, and routes
each request by the pipeline's mode. Interleaved requests are run by the UMM controller.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.errors import ServiceUnavailable
from sglang_omni.pipeline.stages import StageSet
from sglang_omni.pipeline.streams import stream_call
from sglang_omni.runtime.request_ids import RequestIds
from sglang_omni.runtime.stage_handle import StageResult
from sglang_omni.serve.chat_request import ChatRequest

log = logging.getLogger("sglang_omni.orchestrator")


class Orchestrator:
    """Routes requests to stages. Start with ``start()``, stop with ``stop()``."""

    def __init__(self, config: ResolvedConfig, log_level: str = "info") -> None:
        self.config = config
        self.mode = config.pipeline().mode
        self.stages = StageSet(config, log_level)
        self.ids = RequestIds()

    async def start(self) -> None:
        await self.stages.start()

    async def stop(self) -> None:
        await self.stages.stop()

    @property
    def healthy(self) -> bool:
        return self.stages.healthy

    def check_healthy(self) -> None:
        if not self.healthy:
            dead = [h.name for h in self.stages.handles.values() if not h.healthy]
            raise ServiceUnavailable(f"stage(s) {', '.join(dead)} are not running; the server is "
                                     "unhealthy and needs a restart")

    async def text_chat(self, rid: str, req: ChatRequest
                        ) -> AsyncIterator[dict[str, Any] | StageResult]:
        """One Reasoner completion: yields ``{"text": delta}`` chunks, then the StageResult."""
        self.check_healthy()
        payload = {
            "messages": req.messages,
            "sampling": req.sampling,
            "stage_params": req.stage_params.get("reasoner", {}),
            "response_format": req.response_format,
            "stream": req.stream,
            "turn_index": 0,
            "umm_adapter": None,
        }
        async for item in stream_call(self.stages["reasoner"], rid, payload):
            yield item
