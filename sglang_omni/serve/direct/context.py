"""What the direct generation routes share: the generation stage, the server's limits and the
resources the routes own (video jobs, images held for ``url`` answers)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from sglang_omni.config.server import ServerSettings
from sglang_omni.contract.model import ServedModel, served_model
from sglang_omni.contract.result import StageResult
from sglang_omni.media.policy import MediaPolicy
from sglang_omni.pipeline.direct import DirectGenerations
from sglang_omni.pipeline.media_checks import check_generated_media
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.direct.image_store import ImageStore
from sglang_omni.serve.direct.video_jobs import VideoJobs
from sglang_omni.serve.ops.request_log import note_rid
from sglang_omni.serve.protocol.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.protocol.request_states import request_state


@dataclass
class DirectContext:
    """One direct generation server's routes' shared state; ``videos`` and ``images`` are
    owned here and closed at shutdown, with the realtime sessions of :attr:`door`."""

    orchestrator: Orchestrator
    served_name: str
    videos: VideoJobs = field(default_factory=VideoJobs)
    images: ImageStore = field(default_factory=ImageStore)
    #: The pipeline's door to the generation stage: every generation of these routes goes
    #: through it (its admission, request states and realtime sessions).
    door: DirectGenerations = field(init=False)
    #: The model the pipeline serves: its limits, defaults and action route.
    model: ServedModel = field(init=False)

    def __post_init__(self) -> None:
        self.model = served_model(self.orchestrator.config)
        if self.orchestrator.direct is None:
            raise TypeError("the direct routes need a direct generation pipeline")
        self.door = self.orchestrator.direct

    @property
    def policy(self) -> MediaPolicy:
        return self.orchestrator.policy

    @property
    def settings(self) -> ServerSettings:
        return self.orchestrator.config.server

    @property
    def backend(self) -> str:
        return str(self.orchestrator.config.stage("generation").factory.get("backend"))

    @property
    def multiple(self) -> int:
        """The width/height multiple the generation backend needs."""
        return self.model.size_multiple(self.backend)

    async def call(self, request: Request, payload: dict[str, Any],
                   media: Iterable[str] = ()) -> tuple[str, StageResult | None]:
        """Run one image or action generation for a waiting client through the door
        (``DirectGenerations.generate``, in the HTTP request's state): its request id, and its
        result or None when the client went away (aborted, waiting or running)."""
        state = request_state(request)
        rid = self.door.claim(state)
        note_rid(rid)
        try:
            return rid, await until_disconnect(request, self.door.generate(state, payload,
                                                                           media))
        except ClientDisconnected:
            return rid, None

    async def close(self) -> None:
        """Shutdown: end the realtime sessions and the video jobs, forget the images."""
        try:
            await self.door.close()
            await self.videos.close()
        finally:
            await self.images.close()


def single_media(kind: str, result: StageResult) -> bytes:
    """The one ``kind`` item a generation returned; ServerError (500) otherwise. The inline
    limit of interleaved media does not apply: direct routes hold their media themselves."""
    data, _ = check_generated_media(kind, result.payload, result.frames, inline_limit=None)
    return bytes(data)
