"""What the orchestrator reports as it works, for metrics: Reasoner turn and generation times
and admission refusals. The server's metrics implement :class:`PipelineObserver`; the
orchestrator calls a no-op one until they are attached."""

from __future__ import annotations

from typing import Protocol

#: Admission refusal reasons: over ``max_active``, refused by the deadline plan, failed fast by
#: the plan (cannot finish before its deadline), a stage not running, text-only chat over the
#: native admission sum, a request body that does not fit the server's body budget (counted by
#: the HTTP layer).
REFUSAL_REASONS = ("max_active", "plan", "deadline", "stage_down", "chat_queue", "body_budget",
                   "direct_queue", "direct_plan", "direct_wait", "media_budget")


class PipelineObserver(Protocol):
    """Called on the orchestrator's event loop; must not block."""

    def reasoner_turn(self, seconds: float) -> None: ...

    def generation(self, modality: str, seconds: float) -> None: ...

    def refused(self, reason: str) -> None: ...


class NoObserver:
    """Reports nothing."""

    def reasoner_turn(self, seconds: float) -> None:
        return None

    def generation(self, modality: str, seconds: float) -> None:
        return None

    def refused(self, reason: str) -> None:
        return None
