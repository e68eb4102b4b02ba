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
from sglang_omni.pipeline.media_budget import MediaReservation, refs_worst_case
from sglang_omni.pipeline.media_checks import check_generated_media
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.direct.direct_admission import DirectAdmission
from sglang_omni.serve.direct.image_store import ImageStore
from sglang_omni.serve.direct.video_jobs import VideoJobs
from sglang_omni.serve.ops.request_log import note_rid
from sglang_omni.serve.protocol.disconnect import ClientDisconnected, until_disconnect
from sglang_omni.serve.realtime.ws_messages import Sessions


@dataclass
class DirectContext:
    """One direct generation server's routes' shared state; ``videos``, ``images`` and the
    realtime ``sessions`` are owned here and closed at shutdown."""

    orchestrator: Orchestrator
    served_name: str
    videos: VideoJobs = field(default_factory=VideoJobs)
    images: ImageStore = field(default_factory=ImageStore)
    sessions: Sessions = field(default_factory=Sessions)
    #: The image and action requests' queue on the generation stage.
    admission: DirectAdmission = field(init=False)
    #: The model the pipeline serves: its limits, defaults and action route.
    model: ServedModel = field(init=False)

    def __post_init__(self) -> None:
        self.model = served_model(self.orchestrator.config)
        settings = self.orchestrator.config.server
        self.admission = DirectAdmission(
            settings.max_direct_queue, settings.direct_wait_s,
            lambda reason: self.orchestrator.observer.refused(reason))

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

    def stage(self) -> Any:
        """The generation stage (503 while the server is unhealthy)."""
        self.orchestrator.check_healthy()
        return self.orchestrator.stages["generation"]

    def new_rid(self) -> str:
        """A fresh request id, also the current request's in its log line."""
        rid = self.orchestrator.ids.new()
        note_rid(rid)
        return rid

    def hold_media(self, media: Iterable[str]) -> MediaReservation:
        """Reserve the most the generation stage may read for the media references ``media``
        (paths, URLs, inline data; each distinct one once) in the server's client media
        budget: ServiceUnavailable (503, Retry-After) when it does not fit beside what the
        running requests hold. The caller releases it once the generation ended."""
        return self.orchestrator.media_budget.reserve(refs_worst_case(media, self.policy))

    async def admitted(self, rid: str, payload: dict[str, Any],
                       media: Iterable[str] = ()) -> StageResult:
        """Run one generation on the generation stage under an admission ticket of
        :attr:`admission` (ServiceUnavailable, 503, when refused or while the server is
        unhealthy). The one way an image or action request, a realtime action and each chunk
        of a realtime video session reach the stage: each holds its ticket for that
        generation only, never for a whole connection. ``media``: the references the stage
        reads for it, held in the client media budget (:meth:`hold_media`) from now until the
        generation ends."""
        self.stage()  # 503 at once while the server is unhealthy
        hold = self.hold_media(media)
        try:
            async with self.admission.slot():
                return await self.stage().call(rid, payload)
        finally:
            hold.release()

    async def call(self, request: Request, rid: str, payload: dict[str, Any],
                   media: Iterable[str] = ()) -> StageResult | None:
        """Run a generation for a waiting client (:meth:`admitted`); None when the client went
        away (aborted, waiting or running)."""
        try:
            return await until_disconnect(request, self.admitted(rid, payload, media))
        except ClientDisconnected:
            return None

    async def close(self) -> None:
        """Shutdown: end the realtime sessions and the video jobs, forget the images."""
        try:
            await self.sessions.close()
            await self.videos.close()
        finally:
            await self.images.close()


def single_media(kind: str, result: StageResult) -> bytes:
    """The one ``kind`` item a generation returned; ServerError (500) otherwise. The inline
    limit of interleaved media does not apply: direct routes hold their media themselves."""
    data, _ = check_generated_media(kind, result.payload, result.frames, inline_limit=None)
    return bytes(data)
