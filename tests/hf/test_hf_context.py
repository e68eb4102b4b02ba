"""The hf Reasoner's per-request context on the tiny checkpoint (float32, CPU): a later turn of a
request reuses the K/V of the earlier one and gives token for token what a fresh prefill of the
whole prompt gives (checked against transformers' own processor + ``generate``), its earlier media
are neither decoded, preprocessed nor encoded again, and the context is released when the request
ends or is aborted and stays within its byte budget."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFReasoner, conversation, prompt  # noqa: E402
from sglang_omni.engines.hf.common import JobCancelled  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402

GUIDE = "You decide what to generate next. Answer with a JSON decision."


def reasoner(root: Path, decoder: str = "generate", **factory: Any) -> HFReasoner:
    spec = EngineSpec(stage="reasoner", role="reasoner", backend="hf", model_path=str(root),
                      gpu=None, gpu_memory_fraction=None, factory=factory,
                      engine={"max_structured_tokens": 80, "decoder": decoder})
    engine = HFReasoner(spec)
    asyncio.run(engine.start())
    return engine


@pytest.fixture(scope="module")
def engines(tiny_checkpoint: Path) -> Any:
    eager, static = reasoner(tiny_checkpoint), reasoner(tiny_checkpoint, "static")
    yield eager, static
    asyncio.run(eager.close())
    asyncio.run(static.close())


def png(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def turns(n: int, guide: str = GUIDE) -> list[dict]:
    """An interleaved conversation after ``n`` generations: the client's turn, then for each
    generation the Reasoner's decision and the generated image (``omni-frame://i``)."""
    messages: list[dict] = [
        {"role": "system", "content": guide},
        {"role": "user", "content": [
            {"type": "text", "text": "Draw a red cube, look at it, then a blue one."},
            {"type": "image_url", "image_url": {"url": "omni-frame://0"}}]}]
    for i in range(n):
        messages.append({"role": "assistant",
                         "content": f'{{"decision":"generate_image","prompt":"cube {i}"}}'})
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"omni-frame://{i + 1}"}},
            {"type": "text", "text": f"Generated image {i + 1}."}]})
    return messages


FRAMES = [png((200, 30, 30)), png((30, 30, 200)), png((30, 200, 30), (96, 64))]


def run(engine: HFReasoner, rid: str, payload: dict, frames: list[bytes]) -> dict:
    job = Job(rid, payload, frames, emit=lambda _: None)
    return asyncio.run(engine.run(job)).payload


def plain(messages: list[dict]) -> dict:
    return {"messages": messages, "sampling": {"temperature": 0.0, "max_tokens": 24,
                                               "min_tokens": 24}}


def decide(messages: list[dict]) -> dict:
    return {"messages": messages, "sampling": {"temperature": 0.0},
            "response_format": decision.response_format(("image", "video"))}


def reference(engine: HFReasoner, messages: list[dict], frames: list[bytes]) -> list[int]:
    """Greedy tokens of transformers alone: the processor over the whole prompt, then
    ``generate`` (a fresh prefill of every token)."""
    import torch
    from PIL import Image

    rendered = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{"type": "image"} if p["type"] == "image_url" else p for p in content]
        rendered.append({"role": message["role"], "content": content})
    text = engine.processor.apply_chat_template(rendered, tokenize=False,
                                                add_generation_prompt=True)
    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in frames]
    inputs = engine.processor(text=[text], images=images, return_tensors="pt")
    engine.model.model.rope_deltas = None
    with torch.inference_mode():
        out = engine.model.generate(**inputs, max_new_tokens=24, min_new_tokens=24,
                                    do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_later_turns_reuse_the_kv_and_match_a_fresh_prefill(engines: Any) -> None:
    for engine in engines:
        rid = f"reuse-{engine.options['decoder']}"
        first = run(engine, rid, plain(turns(0)), FRAMES[:1])
        held = engine.contexts.held(rid)
        assert held > 0
        before = engine.contexts.stats()
        second = run(engine, rid, plain(turns(1)), FRAMES[:2])
        third = run(engine, rid, plain(turns(2)), FRAMES)
        after = engine.contexts.stats()
        # The second and third prompts extend the first and second: everything the earlier
        # turn's prompt held was reused (its generated reply differs from the decision text).
        assert after["reused_tokens"] - before["reused_tokens"] \
            >= first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"] - 2
        for n, got in ((1, second), (2, third)):
            fresh = run(engine, f"{rid}-fresh-{n}", plain(turns(n)), FRAMES[:n + 1])
            assert got == fresh  # text, usage and finish reason, token for token
            want = reference(engine, turns(n), FRAMES[:n + 1])
            assert got["usage"]["completion_tokens"] == len(want) == 24
            assert got["text"] == engine.tokenizer.decode(want, skip_special_tokens=True)
        # A system message that changes between turns (the Cosmos3 adapter's did, before its
        # budget sentence moved to the prompt's end) cuts the shared prefix short: less is
        # reused, and the answer is still a fresh prefill's.
        rid_g = f"guide-{engine.options['decoder']}"
        run(engine, rid_g, plain(turns(0, "Two generations left.")), FRAMES[:1])
        before = engine.contexts.stats()["reused_tokens"]
        changed = run(engine, rid_g, plain(turns(1, "One generation left.")), FRAMES[:2])
        assert engine.contexts.stats()["reused_tokens"] - before < 8  # the system turn's head
        assert changed == run(engine, f"{rid_g}-fresh", plain(turns(1, "One generation left.")),
                              FRAMES[:2])
        # Decisions under the JSON schema too.
        rid_d = f"decide-{engine.options['decoder']}"
        run(engine, rid_d, decide(turns(0)), FRAMES[:1])
        reused = run(engine, rid_d, decide(turns(1)), FRAMES[:2])
        assert reused == run(engine, f"{rid_d}-fresh", decide(turns(1)), FRAMES[:2])
        decision.parse(reused["text"])


def test_a_prefix_with_other_media_is_not_reused(engines: Any) -> None:
    """The same tokens with another image of the same size are another prompt: the K/V is
    reused only up to that image."""
    engine = engines[0]
    run(engine, "swap", plain(turns(0)), FRAMES[:1])
    other = [png((10, 220, 220))]
    before = engine.contexts.stats()["reused_tokens"]
    swapped = run(engine, "swap", plain(turns(0)), other)
    reused = engine.contexts.stats()["reused_tokens"] - before
    assert reused < swapped["usage"]["prompt_tokens"] - 8
    assert swapped == run(engine, "swap-fresh", plain(turns(0)), other)


def test_a_later_turn_does_not_read_earlier_media_again(
        engines: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engines[0]
    decoded: list[int] = []
    encoded: list[str] = []
    towered: list[int] = []
    decode = conversation.decode_image
    encode = prompt.encode_media
    vision = engine.model.model.get_image_features
    monkeypatch.setattr(conversation, "decode_image",
                        lambda data, label="image": decoded.append(1) or decode(data, label))
    monkeypatch.setattr(prompt, "encode_media",
                        lambda proc, model, item: encoded.append(item.digest)
                        or encode(proc, model, item))
    monkeypatch.setattr(engine.model.model, "get_image_features",
                        lambda *a, **k: towered.append(1) or vision(*a, **k))
    run(engine, "media", plain(turns(0)), FRAMES[:1])
    assert (len(decoded), len(encoded), len(towered)) == (1, 1, 1)
    run(engine, "media", plain(turns(1)), FRAMES[:2])
    assert (len(decoded), len(encoded), len(towered)) == (2, 2, 2)  # the new image only
    run(engine, "media", plain(turns(2)), FRAMES)
    assert (len(decoded), len(encoded), len(towered)) == (3, 3, 3)
    assert len(set(encoded)) == 3
    # The same bytes in another request are that request's own: read again there.
    run(engine, "media-other", plain(turns(0)), FRAMES[:1])
    assert len(encoded) == 4
    stats = engine.contexts.stats()
    assert stats["hits"] >= 3 and stats["misses"] >= 4


def test_the_context_is_released_when_the_request_ends_or_is_aborted(engines: Any) -> None:
    engine = engines[0]
    run(engine, "ends", plain(turns(1)), FRAMES[:2])
    assert engine.contexts.held("ends") > 0
    total, held = engine.contexts.stats()["bytes"], engine.contexts.held("ends")
    engine.end_request("ends")
    assert engine.contexts.held("ends") == 0
    assert engine.contexts.stats()["bytes"] == total - held

    # An abort in the middle of decoding: the turn keeps nothing, and the abort (the stage
    # calls end_request with it) drops what earlier turns kept.
    run(engine, "aborted", plain(turns(0)), FRAMES[:1])
    assert engine.contexts.held("aborted") > 0
    box: list[Job] = []
    seen: list[dict] = []

    def emit(chunk: dict) -> None:
        seen.append(chunk)
        if len(seen) == 3:
            box[0].cancelled.set()
            engine.end_request("aborted")

    job = Job("aborted", {"messages": turns(1), "stream": True,
                          "sampling": {"max_tokens": 200, "min_tokens": 200}},
              FRAMES[:2], emit=emit)
    box.append(job)
    with pytest.raises(JobCancelled):
        asyncio.run(engine.run(job))
    assert engine.contexts.held("aborted") == 0


def test_the_byte_budget_evicts_the_least_recently_used(tiny_checkpoint: Path) -> None:
    engine = reasoner(tiny_checkpoint)
    try:
        run(engine, "a", plain(turns(1)), FRAMES[:2])
        one = engine.contexts.held("a")
        assert one > 0
    finally:
        asyncio.run(engine.close())
    small = reasoner(tiny_checkpoint, context_budget_bytes=one + one // 2)
    try:
        run(small, "a", plain(turns(1)), FRAMES[:2])
        assert small.contexts.held("a") == one
        run(small, "b", plain(turns(1)), FRAMES[:2])
        stats = small.contexts.stats()
        assert stats["bytes"] <= stats["budget"] == one + one // 2
        assert stats["evictions"] >= 1
        assert small.contexts.held("a") < one  # the older request went first
        assert small.contexts.held("b") > 0
        # Evicted context is made again, and the answer is the same.
        again = run(small, "a", plain(turns(1)), FRAMES[:2])
        assert again == run(small, "c", plain(turns(1)), FRAMES[:2])
    finally:
        asyncio.run(small.close())
    none = reasoner(tiny_checkpoint, context_budget_bytes=0)
    try:
        run(none, "a", plain(turns(1)), FRAMES[:2])
        assert none.contexts.stats()["bytes"] == 0
    finally:
        asyncio.run(none.close())
