"""Every admission rule of the server: whether a request may start, decided before any work,
in one place. A refusal is ``ServiceUnavailable`` (503 with ``Retry-After``) counted by reason
in ``sgl_omni_admission_refusals_total`` (``pipeline.observe.REFUSAL_REASONS``), or 400 for a
request that asks for more than the server allows.

* :mod:`.chat`: text-only chat, bounded by the native engine's running + queued limits.
* :mod:`.interleaved`: interleaved requests, at most ``stages.orchestrator.factory.max_active``
  (the deadline plan, ``pipeline.scheduling``, then gives each its allowance).
* :mod:`.direct`: the direct image and action requests, each realtime action and each realtime
  video chunk: the generation stage's queue (``server.max_direct_queue``,
  ``server.direct_wait_s``).
* :mod:`.video_jobs`: ``/v1/videos`` jobs held (``MAX_VIDEO_JOBS``).
* :mod:`.realtime`: realtime sessions (shutdown, the one video session slot,
  ``server.max_realtime_chunks``).
* :mod:`.media_budget`: the client media bytes the running requests hold, for every mode
  (``server.max_client_media_bytes``).

The orchestrator (``pipeline.orchestrator``, ``pipeline.direct``) takes the tickets and records
them on the request's state (``pipeline.request_state``), whose release ends them.
"""

from __future__ import annotations

from typing import Protocol

from sglang_omni.pipeline.admission.chat import ChatAdmission
from sglang_omni.pipeline.admission.direct import DirectAdmission
from sglang_omni.pipeline.admission.interleaved import check_max_active
from sglang_omni.pipeline.admission.media_budget import MediaBudget, MediaReservation
from sglang_omni.pipeline.admission.realtime import Sessions

__all__ = ["ChatAdmission", "DirectAdmission", "MediaBudget", "MediaReservation", "Sessions",
           "Ticket", "check_max_active"]


class Ticket(Protocol):
    """What a request holds while it counts against an admission rule; ``release`` ends it
    and is idempotent."""

    def release(self) -> None: ...
