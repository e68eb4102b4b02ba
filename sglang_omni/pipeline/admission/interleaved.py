"""Admission of interleaved requests: at most ``stages.orchestrator.factory.max_active``
admitted and not yet answered; the next is refused with 503 (reason ``max_active``) before any
model work. The deadline plan (``pipeline.scheduling``) admits it next."""

from __future__ import annotations

from collections.abc import Callable

from sglang_omni.errors import ServiceUnavailable


def check_max_active(admitted: int, max_active: int, on_refused: Callable[[str], None]) -> None:
    """ServiceUnavailable (503) when ``admitted`` requests fill ``max_active``; the refusal is
    counted first (``on_refused("max_active")``)."""
    if admitted >= max_active:
        on_refused("max_active")
        raise ServiceUnavailable(
            f"the server is at stages.orchestrator.factory.max_active ({max_active}) "
            "requests; retry later"
        )
