"""A run whose event iterator never started (the client left first) still ends: its admission,
planner slot and adapter are released when the HTTP layer calls ``end_interleaved``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sglang_omni.config import load_config
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.umm import UMMController, UMMRequest
from tests.umm_contract.test_toy_adapter import toy_adapter

CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"
Toy = toy_adapter()


class Closing(Toy):  # type: ignore[misc, valid-type]
    closed = 0

    def close(self) -> None:
        type(self).closed += 1
        super().close()


async def _unstarted_then_ended() -> tuple[set[str], int | None, int]:
    orchestrator = Orchestrator(load_config(CONFIG, visible_gpus=0))
    await orchestrator.start()
    try:
        orchestrator.controller = UMMController(Closing, orchestrator.limits, orchestrator._call,
                                                planned=orchestrator.scheduler.allowance)
        run = orchestrator.open_interleaved(
            UMMRequest(rid="gone-early", messages=[{"role": "user", "content": "a cube"}]))
        events = orchestrator.interleaved_events(run)
        await events.aclose()  # never started: its own cleanup does not run
        orchestrator.end_interleaved(run)
        orchestrator.end_interleaved(run)  # idempotent
        return (set(orchestrator.active), orchestrator.scheduler.allowance("gone-early"),
                Closing.closed)
    finally:
        await orchestrator.stop()


def test_an_unstarted_run_is_released_once() -> None:
    active, allowance, closed = asyncio.run(_unstarted_then_ended())
    assert active == set() and allowance is None and closed == 1
