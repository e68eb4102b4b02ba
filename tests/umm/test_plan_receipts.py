"""The orchestrator enforces the deadline plan for any adapter (issue 11, defect 6).

The toy adapter of docs/umm-controller.md never reads ``planned_generations``: it dispatches its
generation whatever the plan allows. When the plan has dropped the request's allowance to 0, the
generation is not run: it comes back to the adapter as a receipt (``StageResult.receipt``),
and the request ends, instead of waiting forever for a stage the plan will never give it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sglang_omni.config import load_config
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import ServerError
from sglang_omni.models.cosmos3 import decision, prompts
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter
from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.pipeline.planner import RECEIPT_TEXT, GenerationFinished, TurnEnded
from sglang_omni.pipeline.umm import (
    Budget,
    Complete,
    Dispatch,
    Segment,
    Step,
    UMMController,
    UMMRequest,
)
from tests.umm_contract.test_toy_adapter import toy_adapter, without_reasoner_adapter

CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"
PaintThenDescribe = toy_adapter()


class PaintOrHearWhy(PaintThenDescribe):  # type: ignore[misc, valid-type]
    """The documented toy, plus what an adapter does with a receipt: tell the Reasoner."""

    def advance(self, result: StageResult, budget: Budget) -> Step:
        if result.receipt is not None:
            assert result.payload == {} and result.frames == []
            return Step(dispatch=Dispatch("reasoner", {
                "messages": [{"role": "user", "content": result.receipt}], "sampling": {},
                "turn_index": 0}))
        return super().advance(result, budget)


class AlwaysPaint(PaintThenDescribe):  # type: ignore[misc, valid-type]
    """Ignores receipts too: asks for another generation after every answer."""

    def advance(self, result: StageResult, budget: Budget) -> Step:
        return self.start(self.request, budget)

    def start(self, request: UMMRequest, budget: Budget) -> Step:
        self.request = request
        return Step(dispatch=Dispatch("generation", {"modality": "image", "prompt": "again",
                                                     "options": {"width": 32, "height": 32}},
                                      modality="image"))


async def run_with_plan_at_zero(adapter: type) -> tuple[list[Segment | Complete], Orchestrator]:
    """Admit a request through the orchestrator, measure times at which no generation fits
    before its deadline (its allowance drops to 0), then drive it."""
    orchestrator = Orchestrator(load_config(CONFIG, visible_gpus=0))
    without_reasoner_adapter(orchestrator.stages)  # the toy's Reasoner turns are plain text
    await orchestrator.start()
    try:
        orchestrator.controller = UMMController(
            adapter, orchestrator.limits, orchestrator._call,
            planned=orchestrator.scheduler.allowance)
        async with orchestrator.request() as state:
            rid = orchestrator.claim(state, "toy-plan")
            run = orchestrator.open_interleaved(
                state, UMMRequest(rid=rid, messages=[{"role": "user", "content": "a red cube"}]))
            assert orchestrator.scheduler.allowance("toy-plan") == 8
            planner = orchestrator.scheduler.planner
            timeout_s = orchestrator.limits.timeout_s
            planner.handle(TurnEnded("elsewhere", timeout_s / 4))
            planner.handle(GenerationFinished("elsewhere", "image", timeout_s * 0.9))
            assert orchestrator.scheduler.allowance("toy-plan") == 0
            events = [e async for e in state.closes(run.events())]
        return events, orchestrator
    finally:
        await orchestrator.stop()


def test_a_generation_the_plan_no_longer_allows_comes_back_as_a_receipt() -> None:
    events, orchestrator = asyncio.run(
        asyncio.wait_for(run_with_plan_at_zero(PaintOrHearWhy), timeout=20))
    text, done = events
    assert isinstance(text, Segment) and text.kind == "text"
    assert RECEIPT_TEXT[:40] in (text.text or "")  # the Reasoner was told, then it answered
    assert isinstance(done, Complete) and done.finish_reason == "stop"
    assert orchestrator.states.live == 0 and not orchestrator.scheduler.requests


def test_an_adapter_that_ignores_every_receipt_still_ends() -> None:
    with pytest.raises(ServerError, match="max_dispatches"):
        asyncio.run(asyncio.wait_for(run_with_plan_at_zero(AlwaysPaint), timeout=20))


def test_the_cosmos3_adapter_turns_a_receipt_into_a_final_answer_turn() -> None:
    # It checks planned_generations itself, but the plan can drop between that check and the
    # generation's turn in the queue (a longer time measured meanwhile): then it gets a receipt.
    adapter = Cosmos3UMMAdapter()
    adapter.start(UMMRequest(rid="c1", messages=[{"role": "user", "content": "a cube"}]),
                  Budget(17, 8, 8))
    step = adapter.advance(StageResult({
        "text": decision.render({"action": "image", "prompt": "a cube"})}, [], stage="reasoner"),
        Budget(16, 8, 8))
    assert step.dispatch is not None and step.dispatch.stage == "generation"
    step = adapter.advance(StageResult({}, [], stage="generation", receipt=RECEIPT_TEXT),
                           Budget(15, 7, 0))
    assert step.outputs == () and step.dispatch is not None
    assert step.dispatch.stage == "reasoner"
    messages = step.dispatch.payload["messages"]
    assert messages[-1] == {"role": "user", "content": (
        prompts.NO_TIME_LEFT.format(kind="image")
        + "\n\nNo generations are left: give the final answer now.")}
    assert messages[0] == {"role": "system", "content": prompts.INSTRUCTIONS}
    assert adapter.generations == 0
