"""Omni-side admission for the text-only chat route.

Native SGLang admits requests itself by default: up to ``max_running_requests`` run and the rest
wait in its queue. When ``stages.<stage>.engine`` sets both ``max_running_requests`` and
``max_queued_requests``, Omni bounds the requests in flight to their sum and answers 503 to the
next one before any of its media is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.errors import ConfigError, ServiceUnavailable

LIMIT_KEYS = ("max_running_requests", "max_queued_requests")


def _positive_int(stage: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"stages.{stage}.engine.{key}: expected a positive integer, "
                          f"got {value!r}")
    return value


@dataclass
class AdmissionTicket:
    """One admitted request; ``release`` is idempotent."""

    admission: ChatAdmission
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.in_flight -= 1


class ChatAdmission:
    """Counts admitted chat requests against ``limit`` (None: native admission only).

    Used from one asyncio loop; ``enter`` never awaits, so the check and the count are atomic.
    """

    def __init__(self, stage: str, max_running: int | None, max_queued: int | None) -> None:
        self.stage = stage
        self.max_running = max_running
        self.max_queued = max_queued
        self.in_flight = 0

    @classmethod
    def from_engine(cls, stage: str, engine: dict[str, Any]) -> ChatAdmission:
        """Read the two native limits from a stage's ``engine`` arguments."""
        running, queued = (_positive_int(stage, key, engine.get(key)) for key in LIMIT_KEYS)
        return cls(stage, running, queued)

    @property
    def limit(self) -> int | None:
        if self.max_running is None or self.max_queued is None:
            return None
        return self.max_running + self.max_queued

    def enter(self) -> AdmissionTicket:
        """Admit one request, or raise ServiceUnavailable (503) when the sum is reached."""
        limit = self.limit
        if limit is not None and self.in_flight >= limit:
            raise ServiceUnavailable(
                f"the {self.stage} stage is at its admission limit ({limit} requests: "
                f"stages.{self.stage}.engine.max_running_requests {self.max_running} + "
                f"max_queued_requests {self.max_queued}); retry later"
            )
        self.in_flight += 1
        return AdmissionTicket(self)
