"""``Orchestrator.stop`` ends every mode's orchestrator (the server's lifespan shutdown runs it):
the interleaved pipeline's planner ticker and every stage; the direct-generation and text-only
chat modes have no planner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sglang_omni.config import load_config
from sglang_omni.pipeline.orchestrator import Orchestrator

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize(("config", "text_only", "mode"), [
    ("cpu-scripted.yaml", False, "umm"),
    ("cpu-direct-scripted.yaml", False, "generation"),
    (None, True, "chat"),
])
def test_stop_ends_an_orchestrator_of_every_mode(config: str | None, text_only: bool,
                                                 mode: str) -> None:
    path = CONFIGS / config if config else None
    orchestrator = Orchestrator(load_config(path, visible_gpus=0, text_only=text_only,
                                            overrides={"reasoner.factory.backend": "scripted",
                                                       "reasoner.gpu": None}
                                            if text_only else None))
    assert orchestrator.mode == mode
    asyncio.run(orchestrator.stop())  # never started: nothing to end, and no error
