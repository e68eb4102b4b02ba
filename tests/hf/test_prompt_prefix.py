"""The Cosmos3 adapter lays each Reasoner turn out so it extends the turn before it, token for
token, and the hf Reasoner's context prefills only what is new (the tiny checkpoint, float32, on
the CPU): the guide is the same on every turn, and the turn's budget sentence ends the prompt and
stays in the conversation after it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from sglang_omni.contract.job import Job  # noqa: E402
from sglang_omni.contract.result import StageResult  # noqa: E402
from sglang_omni.engines.hf import reasoner as hf_reasoner  # noqa: E402
from sglang_omni.models.cosmos3 import prompts  # noqa: E402
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter  # noqa: E402
from sglang_omni.pipeline.umm import Budget, UMMRequest  # noqa: E402
from tests.hf.test_hf_context import png, reasoner  # noqa: E402

TURNS = 3  # two generations, and the Reasoner turn before and after each
COLORS = [(200, 30, 30), (30, 30, 200)]


def test_each_turn_extends_the_last_and_prefills_only_its_new_tokens(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = reasoner(tiny_checkpoint)
    prompt_ids: list[list[int]] = []
    build = hf_reasoner.build_prompt

    def recorded(*args: Any, **kwargs: Any) -> Any:
        prompt = build(*args, **kwargs)
        prompt_ids.append(prompt.ids[0].tolist())
        return prompt

    monkeypatch.setattr(hf_reasoner, "build_prompt", recorded)
    end_id = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    adapter = Cosmos3UMMAdapter()
    request = UMMRequest(rid="layout", messages=[
        {"role": "user", "content": "Draw a red cube, look at it, then a blue one."}])
    dispatches = 17
    step = adapter.start(request, Budget(dispatches, 8))
    replies: list[str] = []
    context: list[dict[str, int]] = []
    try:
        while len(replies) < TURNS:
            dispatch = step.dispatch
            assert dispatch is not None
            dispatches -= 1
            budget = Budget(dispatches, 8 - adapter.generations)
            if dispatch.stage == "generation":
                made = png(COLORS[adapter.generations])
                step = adapter.advance(StageResult({"media": [
                    {"kind": "image", "frame": 0, "mime_type": "image/png"}]}, [made],
                    stage="generation"), budget)
                continue
            before = engine.contexts.stats()
            job = Job(request.rid, dict(dispatch.payload), list(dispatch.frames),
                      emit=lambda _: None)
            result = asyncio.run(engine.run(job))
            after = engine.contexts.stats()
            context.append({k: after[k] - before[k] for k in ("reused_tokens",
                                                              "prefilled_tokens")})
            replies.append(result.payload["text"])
            assert '"generate_image"' in replies[-1]  # the tiny checkpoint's greedy decisions
            step = adapter.advance(StageResult(result.payload, [], stage="reasoner"), budget)
    finally:
        asyncio.run(engine.close())

    assert len(prompt_ids) == TURNS
    for turn in range(1, TURNS):
        previous, prompt = prompt_ids[turn - 1], prompt_ids[turn]
        # The previous prompt, then its reply as the chat template renders it (the reply's
        # text, tokenized, and the end of the assistant turn), then what this turn adds.
        reply = engine.tokenizer.encode(replies[turn - 1], add_special_tokens=False)
        assert prompt[:len(previous) + len(reply) + 1] == previous + reply + [end_id], turn
        # The context reused every token the previous turn computed that this prompt shares
        # (its prompt, and its reply up to where the model chose other tokens than the text's
        # own tokenization: random weights do) and prefilled only the rest.
        assert context[turn]["reused_tokens"] >= len(previous)
        assert context[turn]["reused_tokens"] + context[turn]["prefilled_tokens"] == len(prompt)
    assert context[0]["reused_tokens"] == 0


def test_the_guide_is_the_same_and_the_budget_ends_every_turn() -> None:
    """What the Reasoner is told: the same guide on every turn, and each turn's budget sentence
    at the end of its prompt, kept there on later turns."""
    adapter = Cosmos3UMMAdapter()
    client = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "Draw a cube."}]}]
    step = adapter.start(UMMRequest(rid="told", messages=client), Budget(17, 8))
    first = step.dispatch.payload["messages"] if step.dispatch else []
    raw = '{"decision":"generate_image","prompt":"a cube"}'
    step = adapter.advance(StageResult({"text": raw}, [], stage="reasoner"), Budget(16, 8))
    step = adapter.advance(StageResult({"media": [
        {"kind": "image", "frame": 0, "mime_type": "image/png"}]}, [png((9, 9, 9))],
        stage="generation"), Budget(3, 7))
    second = step.dispatch.payload["messages"] if step.dispatch else []
    guide = f"{prompts.INSTRUCTIONS}\n\nBe brief."
    assert first == [{"role": "system", "content": guide},
                     {"role": "user", "content": [
                         {"type": "text", "text": "Draw a cube."},
                         {"type": "text", "text": "\n\nYou may create images and videos; "
                                                  "8 generation(s) left."}]}]
    assert second[:2] == first
    assert second[2:] == [
        {"role": "assistant", "content": raw},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "omni-frame://0"}},
            {"type": "text", "text": "Generated image 1, from the prompt: a cube"},
            {"type": "text", "text": "\n\nYou may create images and videos; "
                                     "1 generation(s) left."}]}]
    # A client turn that does not end with a user message gets the sentence as its own turn.
    ended = Cosmos3UMMAdapter().start(UMMRequest(rid="told-2", messages=[
        {"role": "user", "content": "Draw."}, {"role": "assistant", "content": "Sure."}]),
        Budget(1, 8))
    assert ended.dispatch is not None
    assert ended.dispatch.payload["messages"][-1] == {
        "role": "user", "content": "No generations are left: give the final answer now."}
