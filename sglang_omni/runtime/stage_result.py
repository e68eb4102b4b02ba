"""What a stage call returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.runtime.ipc import Frames


@dataclass
class StageResult:
    """A stage's answer; ``engine_s`` is the time the engine spent on it (stage-measured)."""

    payload: dict[str, Any]
    frames: Frames
    engine_s: float = 0.0
