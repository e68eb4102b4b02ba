"""What a stage call returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.runtime.ipc import Frames


@dataclass
class StageResult:
    payload: dict[str, Any]
    frames: Frames
