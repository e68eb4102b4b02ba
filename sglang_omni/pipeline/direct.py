"""The pipeline's door for direct generation: every image, action, video job and realtime
session generation reaches the generation stage through :class:`DirectGenerations`, never from
the HTTP layer (an import-graph test forbids serve/ to import the stage handle).

Each generation holds a request state (``pipeline.request_state``): its request id is claimed
there (``RequestIds``: in flight while it runs, kept taken for a while after), and its admission
ticket (``pipeline.admission.direct``) and client media bytes (``pipeline.admission.
media_budget``) are recorded there, so the orchestrator's release of that state is the one place
that ends them. A request refused before any work has its id forgotten.

* :meth:`DirectGenerations.generate`: an image or action request whose client waits; its state
  is the HTTP request's (claimed with :meth:`DirectGenerations.claim`).
* :meth:`DirectGenerations.generate_alone`: one generation of a realtime session (an action, a
  video chunk), in a state of its own that ends with the generation.
* :meth:`DirectGenerations.open_job`, :meth:`~DirectGenerations.run_job`,
  :meth:`~DirectGenerations.end_job`: a video job, which runs on after its answer.
* :attr:`DirectGenerations.sessions`: the realtime sessions (``pipeline.admission.realtime``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sglang_omni.contract.result import StageResult
from sglang_omni.errors import ServiceUnavailable
from sglang_omni.pipeline.admission.direct import DirectAdmission
from sglang_omni.pipeline.admission.media_budget import refs_worst_case
from sglang_omni.pipeline.admission.realtime import Sessions
from sglang_omni.pipeline.request_state import RequestState

if TYPE_CHECKING:
    from sglang_omni.pipeline.orchestrator import Orchestrator
    from sglang_omni.runtime.stage.handle import StageHandle

#: The generation stage's name in a direct generation pipeline.
STAGE = "generation"


class DirectGenerations:
    """The direct routes' door to the generation stage of ``orchestrator``; one per server."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self._orch = orchestrator
        settings = orchestrator.config.server
        #: The image and action requests' queue on the generation stage (realtime actions and
        #: chunks included).
        self.admission = DirectAdmission(settings.max_direct_queue, settings.direct_wait_s,
                                         lambda reason: orchestrator.observer.refused(reason))
        #: The realtime sessions running (closed at shutdown).
        self.sessions = Sessions()

    def _stage(self) -> StageHandle:
        """The generation stage (503 while the server is unhealthy or stopping)."""
        self._orch.check_healthy()
        return self._orch.stages[STAGE]

    def claim(self, state: RequestState) -> str:
        """Claim a fresh request id for ``state`` (it ends with the state's release)."""
        return self._orch.claim(state)

    def _hold_media(self, state: RequestState, media: Iterable[str]) -> None:
        """Reserve in the client media budget the most the stage may read for the media
        references ``media`` (each distinct one once): 503 when it does not fit beside what the
        running requests hold. Recorded on ``state``."""
        state.media_hold = self._orch.media_budget.reserve(
            refs_worst_case(media, self._orch.policy))

    async def generate(self, state: RequestState, payload: dict[str, Any],
                       media: Iterable[str] = ()) -> StageResult:
        """Run one generation for the claimed ``state`` under a ticket of :attr:`admission`
        (ServiceUnavailable, 503, when refused or while the server is unhealthy). ``media``:
        the references the stage reads for it, held in the client media budget from now until
        the generation ends. The ticket and the bytes end with the generation (and with the
        state, however it ends)."""
        assert state.rid is not None, "claim the request id first"
        try:
            try:
                self._stage()  # 503 at once while the server is unhealthy
                self._hold_media(state, media)
                state.take(await self.admission.enter())
                handle = self._stage()
            except ServiceUnavailable:
                state.refused = True  # before any work: the id is free again
                raise
            return await handle.call(state.rid, payload)
        finally:
            self._orch.end_admission(state)

    async def generate_alone(self, payload: dict[str, Any],
                             media: Iterable[str] = ()) -> tuple[str, StageResult]:
        """:meth:`generate` in a request state of its own, released as it returns: one
        generation of a realtime session. Its request id and result."""
        async with self._orch.request() as state:
            rid = self.claim(state)
            return rid, await self.generate(state, payload, media)

    def open_job(self, media: Iterable[str]) -> RequestState:
        """A video job's state: its request id (the job's id) claimed and its ``media`` held
        in the client media budget until the job ends (503 at once while the server is
        unhealthy, or when they do not fit). The caller runs :meth:`run_job` in a task it
        owns and calls :meth:`end_job` once that task ended, however it ended (a task
        cancelled before it ran never entered :meth:`run_job`), or at once when the job is
        not started."""
        self._stage()
        state = self._orch.request()
        self._hold_media(state, media)
        try:
            self.claim(state)
        except BaseException:
            self.end_job(state, refused=True)
            raise
        return state

    async def run_job(self, state: RequestState, payload: dict[str, Any],
                      on_chunk: Callable[[dict[str, Any]], None] | None = None) -> StageResult:
        """Run the generation of the video job ``state`` (:meth:`open_job`); its progress
        chunks go to ``on_chunk``. The state is released as it ends."""
        assert state.rid is not None
        try:
            return await self._orch.stages[STAGE].call(state.rid, payload, on_chunk=on_chunk)
        finally:
            self.end_job(state)

    def end_job(self, state: RequestState, refused: bool = False) -> None:
        """Release the video job ``state`` (idempotent); ``refused``: it never ran."""
        if refused:
            state.refused = True
        self._orch.states.end_now(state)

    async def close(self) -> None:
        """Shutdown: end the realtime sessions."""
        await self.sessions.close()
