"""A run whose event iterator never started (the client left first) still ends: its admission,
planner slot, adapter and request id are released once, when its request state is."""

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


async def _unstarted_then_ended() -> tuple[int, int, int | None, int, int]:
    orchestrator = Orchestrator(load_config(CONFIG, visible_gpus=0))
    await orchestrator.start()
    try:
        orchestrator.controller = UMMController(Closing, orchestrator.limits, orchestrator._call,
                                                planned=orchestrator.scheduler.allowance)
        async with orchestrator.request() as state:
            rid = orchestrator.claim(state, "gone-early")
            run = orchestrator.open_interleaved(
                state, UMMRequest(rid=rid, messages=[{"role": "user", "content": "a cube"}]))
            state.closes(run.events())  # never started: its own cleanup does not run
            admitted = orchestrator.admitted
        return (admitted, orchestrator.admitted, orchestrator.scheduler.allowance("gone-early"),
                Closing.closed, orchestrator.states.live)
    finally:
        await orchestrator.stop()


def test_an_unstarted_run_is_released_once() -> None:
    admitted, after, allowance, closed, live = asyncio.run(_unstarted_then_ended())
    assert (admitted, after, allowance, closed, live) == (1, 0, None, 1, 0)
