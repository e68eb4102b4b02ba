"""The native tier: the prompts native SGLang builds for an interleaved request's Reasoner turns
extend each other token for token, so its radix cache reuses each earlier turn.

The Cosmos3 adapter's turns run through ``NativeReasoner`` and the real ``OpenAIServingChat``
(SGLang's chat-template rendering and request building) with the tiny checkpoint's tokenizer and
chat template, loaded by SGLang's own ``get_tokenizer``. Native's scheduler and model cannot run
on the CPU, so the tokenizer manager stands in for them: it tokenizes the prompt SGLang built,
looks it up in SGLang's own ``RadixCache`` (a simulated one, without memory pools: the tree and
its matching are the real ones), reports the match as ``cached_tokens``, answers the next
scripted decision (its tokens: the reply's text tokenized, then the end of turn, as a trained
model writes them) and keeps prompt + reply in the cache as native's scheduler does when a
request finishes (every token with K/V: all but the last)."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang", reason="the native tier needs the pinned sglang (native extra)")

from sglang.test.test_utils import maybe_stub_sgl_kernel  # noqa: E402

maybe_stub_sgl_kernel()

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402
from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer  # noqa: E402
from sglang.test.test_utils import published_topology  # noqa: E402

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.contract.result import StageResult  # noqa: E402
from sglang_omni.engines.native.reasoner import NativeReasoner  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter  # noqa: E402
from sglang_omni.models.cosmos3.tiny_checkpoint import DEFAULT_SEED, make_tokenizer  # noqa: E402
from sglang_omni.pipeline.umm import Budget, UMMRequest  # noqa: E402
from tests.chat.kit import png  # noqa: E402
from tests.native.fakes import FakeEngine, FakeTokenizerManager, _meta  # noqa: E402

pytestmark = pytest.mark.native

DECISIONS = [{"action": "image", "prompt": "a red cube"},
             {"action": "image", "prompt": "a blue cube beside it"},
             {"action": "final", "text": "Two cubes, red and blue."}]


@pytest.fixture(autouse=True)
def topology() -> Iterator[None]:
    """The runtime context a real Engine publishes (OpenAIServingChat reads it)."""
    with published_topology():
        yield


def radix_key(ids: list[int]) -> RadixKey:
    return RadixKey(token_ids=array("q", ids))


class CachingTokenizerManager(FakeTokenizerManager):
    """Native's tokenizer manager and scheduler, as far as the prefix cache goes (see above)."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        super().__init__(multimodal=True)
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.cache = RadixCache.create_simulated()
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []  # each turn's prompt ids
        self.outputs: list[list[int]] = []  # each turn's reply ids
        self.cached: list[int] = []  # each turn's cached_tokens

    async def generate_request(self, obj: Any, request: Any = None):  # noqa: ANN201
        obj.normalize_batch_and_arguments()
        self.requests.append(obj)
        ids = (list(obj.input_ids) if obj.input_ids is not None
               else self.tokenizer.encode(obj.text, add_special_tokens=False))
        cached = self.cache.match_prefix(MatchPrefixParams(key=radix_key(ids)))
        reply = self.replies.pop(0)
        output = [*self.tokenizer.encode(reply, add_special_tokens=False), self.end_id]
        kept = (ids + output)[:-1]
        self.cache.insert(InsertParams(key=radix_key(kept), value=torch.arange(len(kept))))
        self.prompts.append(ids)
        self.outputs.append(output)
        self.cached.append(cached.device_prefix_len)
        meta = _meta(obj.rid, len(output), {"type": "stop", "matched": self.end_id})
        meta.update(prompt_tokens=len(ids), cached_tokens=cached.device_prefix_len)
        yield {"text": reply, "index": 0, "meta_info": meta}


def test_each_turns_prompt_extends_the_last_and_the_radix_cache_reuses_it(
        tmp_path: Path) -> None:
    make_tokenizer(DEFAULT_SEED).save_pretrained(tmp_path / "tiny")
    tokenizer = get_tokenizer(str(tmp_path / "tiny"))
    replies = [decision.render(d) for d in DECISIONS]
    manager = CachingTokenizerManager(tokenizer, replies)

    def engine(kwargs: dict[str, Any]) -> FakeEngine:
        fake = FakeEngine(kwargs)
        fake.tokenizer_manager = manager
        return fake

    spec = EngineSpec(stage="reasoner", role="reasoner", backend="native",
                      model_path=str(tmp_path / "tiny"), gpu=0, gpu_memory_fraction=None,
                      factory={}, engine={"skip_server_warmup": True}, media_policy={})
    reasoner = NativeReasoner(spec, engine_factory=engine)
    adapter = Cosmos3UMMAdapter()
    request = UMMRequest(rid="native-layout", messages=[
        {"role": "user", "content": "Draw a red cube, look at it, then a blue one."}])
    colors = [(200, 30, 30), (30, 30, 200)]

    async def scenario() -> list[str]:
        await reasoner.start()
        dispatches = 17
        step = adapter.start(request, Budget(dispatches, 8))
        texts = []
        while step.dispatch is not None:
            dispatch = step.dispatch
            dispatches -= 1
            budget = Budget(dispatches, 8 - adapter.generations)
            if dispatch.stage == "generation":
                result = StageResult({"media": [
                    {"kind": "image", "frame": 0, "mime_type": "image/png"}]},
                    [png(colors[adapter.generations])], stage="generation")
            else:
                job = Job(request.rid, dict(dispatch.payload), list(dispatch.frames),
                          emit=lambda _: None)
                result = await reasoner.run(job)
                texts.append(result.payload["text"])
            step = adapter.advance(result, budget)
        await reasoner.close()
        return texts

    assert asyncio.run(scenario()) == replies
    prompts, outputs, cached = manager.prompts, manager.outputs, manager.cached
    assert len(prompts) == len(DECISIONS)
    # SGLang built multimodal requests: the generated images went to it as files.
    assert [len(obj.image_data or []) for obj in manager.requests] == [0, 1, 2]
    for turn in range(1, len(prompts)):
        before = prompts[turn - 1] + outputs[turn - 1]
        assert prompts[turn][:len(before)] == before, turn
        assert len(prompts[turn]) > len(before)
        # Everything the previous turn computed is reused: its prompt and its reply.
        assert cached[turn] == len(before) - 1
    assert cached[0] == 0 and cached[1] < cached[2]
