"""``StageResult``: a stage's answer, the one result type from the engine to the adapter.

An engine returns it from ``run`` with its payload and frames; the stage handle passes it on
with ``engine_s`` (the time the stage measured) and ``stage`` (the stage that answered) set;
the UMM controller hands it to the adapter, or one with ``receipt`` set for a dispatch it did
not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Binary frames that travel beside a stage message (inline media bytes).
Frames = list[bytes | bytearray]


@dataclass(frozen=True)
class StageResult:
    """A stage's answer. ``payload`` is one of the result payloads of ``contract.payloads`` for
    the built-in engines; media bytes are in ``frames``.

    ``engine_s``: seconds the engine spent on it (stage-measured; 0 until the stage handle has
    it). ``spans``: where those seconds went (``pipeline.timeline``: the engine's spans, then the
    orchestrator's ``wait`` and ``relay``). ``stage``: the stage that answered ("" until the
    stage handle has it). ``receipt``: set
    when the dispatch was not run (the deadline plan no longer allows the generation); payload
    and frames are then empty, and the adapter should tell the Reasoner ``receipt`` and ask for
    the final answer.
    """

    payload: Mapping[str, Any]
    frames: Frames = field(default_factory=list)
    engine_s: float = 0.0
    stage: str = ""
    receipt: str | None = None
    spans: Mapping[str, float] = field(default_factory=dict)
