"""Run the toy adapter of docs/umm-controller.md, exactly as written there, against the real
scripted stage processes through the model-agnostic controller."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_omni.config import load_config
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest
from sglang_omni.pipeline.stages import StageSet
from sglang_omni.pipeline.umm import Complete, Limits, Segment, UMMController
from sglang_omni.pipeline.umm import UMMRequest as Request

DOC = Path(__file__).parents[2] / "docs" / "umm-controller.md"
CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"


def toy_adapter() -> type:
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", DOC.read_text(), re.DOTALL)
    source = next(b for b in blocks if "class PaintThenDescribe" in b)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["PaintThenDescribe"]


def without_reasoner_adapter(stages: StageSet) -> StageSet:
    """Start the Reasoner stage with no UMM adapter (a start-up fact of its spec): the toy's
    Reasoner turn is a plain question, answered as text."""
    reasoner = stages["reasoner"]
    reasoner.spec = replace(reasoner.spec, umm_adapter=None)
    return stages


async def run_toy(messages: list[dict[str, Any]]) -> list[Segment | Complete]:
    stages = without_reasoner_adapter(StageSet(load_config(CONFIG, visible_gpus=0)))
    await stages.start()
    try:
        async def call(stage: str, rid: str, payload: dict, frames: list) -> StageResult:
            return await stages[stage].call(rid, payload, frames)

        controller = UMMController(toy_adapter(), Limits(), call)
        run = controller.open(Request(rid="toy-1", messages=messages))
        return [event async for event in run.events()]
    finally:
        await stages.stop()


def test_toy_adapter_paints_then_describes() -> None:
    events = asyncio.run(run_toy([{"role": "user", "content": "a red cube"}]))
    image, text, done = events
    assert isinstance(image, Segment) and image.kind == "image" and image.segment_index == 0
    assert image.media is not None and image.media.startswith(b"\x89PNG")
    assert isinstance(text, Segment) and text.kind == "text" and text.segment_index == 1
    assert "Describe this picture of: a red cube" in (text.text or "")
    assert isinstance(done, Complete) and done.finish_reason == "stop"
    assert done.usage["completion_tokens"] > 0


def test_toy_adapter_refuses_in_start() -> None:
    controller = UMMController(toy_adapter(), Limits(), call=None)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        controller.open(Request(rid="toy-2", messages=[{"role": "user", "content": "  "}]))
