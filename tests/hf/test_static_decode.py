"""The static-cache decoder (the GPU fast path, run here on the CPU without graphs) gives the
same greedy tokens as transformers' ``generate`` in float32 on the tiny checkpoint: plain text,
a multimodal prompt (3D positions, deepstack), the JSON-schema constraint, stop rules, logprobs,
and cache lengths that grow across buckets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFReasoner, static_decode  # noqa: E402
from sglang_omni.engines.hf.decode_loop import static_generate  # noqa: E402
from sglang_omni.engines.hf.static_decode import StaticDecoder, cache_bucket  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402


def reasoner(root: Path, decoder: str) -> HFReasoner:
    spec = EngineSpec(stage="reasoner", role="reasoner", backend="hf", model_path=str(root),
                      gpu=None, gpu_memory_fraction=None, factory={},
                      engine={"max_structured_tokens": 80, "decoder": decoder})
    engine = HFReasoner(spec)
    asyncio.run(engine.start())
    return engine


@pytest.fixture(scope="module")
def engines(tiny_checkpoint: Path) -> Any:
    eager, static = reasoner(tiny_checkpoint, "generate"), reasoner(tiny_checkpoint, "static")
    assert eager.decoder is None and isinstance(static.decoder, StaticDecoder)
    assert not static.decoder.graphs  # no CUDA here
    yield eager, static
    asyncio.run(eager.close())
    asyncio.run(static.close())


def run(engine: HFReasoner, payload: dict, frames: list[bytes] | None = None) -> tuple:
    chunks: list[dict] = []
    job = Job("t", payload, frames or [], emit=chunks.append)
    return asyncio.run(engine.run(job)), chunks


def png(color: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="PNG")
    return buf.getvalue()


def test_cache_buckets_are_powers_of_two() -> None:
    assert cache_bucket(1) == cache_bucket(1024) == 1024
    assert cache_bucket(1025) == 2048 and cache_bucket(5000) == 8192


def test_greedy_plain_text_matches_generate_across_cache_buckets(
        engines: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(static_decode, "MIN_CACHE", 8)  # many bucket changes in 60 tokens
    eager, static = engines
    static.decoder.capacity = 0  # start from an empty cache again
    steps: list[int] = []
    step = static.decoder.step
    monkeypatch.setattr(static.decoder, "step",
                        lambda token, index: steps.append(index) or step(token, index))
    payload = {"messages": [{"role": "user", "content": "Describe a red cube on a table."}],
               "sampling": {"max_tokens": 60, "min_tokens": 60},
               "options": {"logprobs": True, "top_logprobs": 2}, "stream": True}
    (a, chunks_a), (b, chunks_b) = run(eager, payload), run(static, payload)
    assert a.payload["usage"] == b.payload["usage"]
    assert a.payload["text"] == b.payload["text"] and chunks_a == chunks_b
    prompt = a.payload["usage"]["prompt_tokens"]
    # the static path stepped the prompt's last token (the rest is prefilled) and decoded 59
    assert steps == list(range(prompt - 1, prompt + 59))
    assert static.decoder.capacity == 128
    first_a, first_b = a.payload["logprobs"]["content"], b.payload["logprobs"]["content"]
    assert [t["token"] for t in first_a] == [t["token"] for t in first_b]
    assert max(abs(x["logprob"] - y["logprob"]) for x, y in zip(first_a, first_b,
                                                                strict=True)) < 1e-4


def test_greedy_decisions_with_images_match_generate(engines: Any) -> None:
    eager, static = engines
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Draw a cube, look at it, then answer."},
        {"type": "image_url", "image_url": {"url": "omni-frame://0"}}]},
        {"role": "assistant", "content": '{"decision":"generate_image","prompt":"x"}'},
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "omni-frame://1"}},
                                     {"type": "text", "text": "Generated."}]}]
    frames = [png((200, 30, 30)), png((30, 30, 200))]
    for modalities in (("image", "video"), ()):
        payload = {"messages": messages, "sampling": {"temperature": 0.0},
                   "response_format": decision.response_format(modalities), "stream": False}
        a, _ = run(eager, payload, frames)
        b, _ = run(static, payload, frames)
        assert a.payload == b.payload
        decision.parse(b.payload["text"])


def test_stop_strings_stop_ids_and_sampling_follow_generate(engines: Any) -> None:
    eager, static = engines
    words = {"messages": [{"role": "user", "content": "List colors."}],
             "sampling": {"max_tokens": 40, "stop": [" the"], "stop_token_ids": [300]}}
    assert run(eager, words)[0].payload == run(static, words)[0].payload
    sampled = {"messages": [{"role": "user", "content": "List colors."}],
               "sampling": {"max_tokens": 20, "temperature": 0.9, "top_k": 20, "top_p": 0.9,
                            "seed": 5, "repetition_penalty": 1.1, "presence_penalty": 0.5}}
    assert run(eager, sampled)[0].payload == run(static, sampled)[0].payload


def test_the_decoder_refuses_a_step_past_its_cache(engines: Any) -> None:
    import torch

    _, static = engines
    decoder = static.decoder
    with pytest.raises(RuntimeError, match="static cache"):
        decoder.step(torch.tensor([1]), decoder.capacity)
    with pytest.raises(TypeError, match="does not take"):
        static_generate(decoder, {"input_ids": torch.ones(1, 3, dtype=torch.long)},
                        num_beams=2)
