"""Out of GPU memory in the hf engines, on the tiny checkpoint (CPU): an allocation error raised
inside the model (as ``torch.OutOfMemoryError`` is on a full GPU) fails the request with
``OutOfGPUMemory`` naming the stage and what to change; by the time the caller hears it, what the
request allocated is freed (the error's frames are dropped: a tensor made inside the failed call
is gone), the hf Reasoner's context for the request is released, and the next request on the
same engine succeeds (a static cache whose growth failed is not left half-made)."""

from __future__ import annotations

import asyncio
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

import torch  # noqa: E402

from sglang_omni.contract.job import Job  # noqa: E402
from sglang_omni.errors import OutOfGPUMemory  # noqa: E402
from tests.hf.test_hf_context import FRAMES, plain, reasoner, run, turns  # noqa: E402
from tests.hf.test_hf_engines import SMALL, Loop, spec  # noqa: E402

OOM_TEXT = "CUDA out of memory. Tried to allocate 20.00 GiB (raised by the test)"


class Allocations:
    """Tensors made inside the failing call, watched through weak references."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []

    def make_then_fail(self) -> None:
        held = torch.ones(1 << 20)  # 4 MiB the failed call holds in its frame
        self.refs.append(weakref.ref(held))
        raise torch.OutOfMemoryError(OOM_TEXT)

    def freed(self) -> bool:
        return bool(self.refs) and all(ref() is None for ref in self.refs)


def test_generation_oom_fails_the_request_frees_it_and_the_next_is_served(
        tiny_checkpoint: Path) -> None:
    from sglang_omni.engines.hf import HFGenerator

    loop = Loop()
    generator = HFGenerator(spec("generation", tiny_checkpoint))
    loop.run(generator.start())
    made = Allocations()
    hook = generator.pipe.transformer.register_forward_hook(
        lambda *_: made.make_then_fail())
    payload = {"modality": "image", "prompt": "a cube", "options": SMALL}
    try:
        with pytest.raises(OutOfGPUMemory) as caught:
            loop.run(generator.run(Job("oom", payload, [], emit=lambda _: None)))
    finally:
        hook.remove()
    message = caught.value.message
    assert "the generation stage ran out of GPU memory for this request" in message, message
    assert OOM_TEXT in message and "smaller width and height" in message, message
    assert "stages.generation.gpu_memory_fraction" in message, message
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert made.freed(), "the failed generation's tensors are still held"
    result = loop.run(generator.run(Job("next", payload, [], emit=lambda _: None)))
    assert result.payload["media"][0]["mime_type"] == "image/png"
    loop.run(generator.close())
    loop.loop.call_soon_threadsafe(loop.loop.stop)


@pytest.fixture(scope="module")
def static_reasoner(tiny_checkpoint: Path) -> Any:
    engine = reasoner(tiny_checkpoint, "static")
    yield engine
    asyncio.run(engine.close())


def test_reasoner_oom_releases_the_request_context_and_its_tensors(static_reasoner: Any,
                                                                   monkeypatch: Any) -> None:
    engine = static_reasoner
    run(engine, "kept", plain(turns(1)), FRAMES[:2])  # a request whose context holds media + K/V
    assert engine.contexts.held("kept") > 0
    made = Allocations()
    hook = engine.model.model.language_model.register_forward_hook(
        lambda *_: made.make_then_fail())
    try:
        with pytest.raises(OutOfGPUMemory) as caught:
            run(engine, "kept", plain(turns(2)), FRAMES)  # its next turn runs out of memory
    finally:
        hook.remove()
    message = caught.value.message
    assert "the reasoner stage ran out of GPU memory for this request" in message, message
    assert "fewer or smaller images and videos" in message, message
    assert engine.contexts.held("kept") == 0, "the failed request's context is still held"
    assert made.freed(), "the failed turn's tensors are still held"
    assert run(engine, "next", plain(turns(1)), FRAMES[:2])["text"]


def test_a_static_cache_whose_growth_ran_out_of_memory_is_made_again(static_reasoner: Any,
                                                                     monkeypatch: Any) -> None:
    """The cache grows for a long reply and the allocation fails half way: the next, shorter
    request must not find a cache that claims the old size with layers missing."""
    engine = static_reasoner
    run(engine, "short", plain(turns(0)), FRAMES[:1])
    assert engine.decoder.capacity > 0
    zeros = torch.zeros
    calls = [0]

    def zeros_failing_in_reserve(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_name == "reserve":
            calls[0] += 1
            if calls[0] == 3:
                raise torch.OutOfMemoryError(OOM_TEXT)
        return zeros(*args, **kwargs)

    long_reply = {**plain(turns(0)), "sampling": {"temperature": 0.0, "max_tokens": 4000}}
    monkeypatch.setattr(torch, "zeros", zeros_failing_in_reserve)
    with pytest.raises(OutOfGPUMemory):
        run(engine, "long", long_reply, FRAMES[:1])
    monkeypatch.setattr(torch, "zeros", zeros)
    assert calls[0] == 3
    assert run(engine, "after", plain(turns(0)), FRAMES[:1])["text"]


def test_a_vae_decode_that_ran_out_of_memory_leaves_no_cached_features(
        tiny_checkpoint: Path) -> None:
    """The VAE decodes frame by frame, keeping its causal convolutions' features between
    frames; a decode that fails part way must not leave them held (measured on an H200: 1.85 GiB
    held after a 1280x720 video's decode ran out of memory, until the next request)."""
    from sglang_omni.engines.hf import HFGenerator

    loop = Loop()
    generator = HFGenerator(spec("generation", tiny_checkpoint))
    loop.run(generator.start())
    vae = generator.pipe.vae
    calls = [0]

    def fail_on_the_second_frame(*_: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the first frame's features are cached by now
            assert any(feature is not None for feature in vae._feat_map)
            raise torch.OutOfMemoryError(OOM_TEXT)

    hook = vae.decoder.register_forward_pre_hook(fail_on_the_second_frame)
    payload = {"modality": "video", "prompt": "a cube", "options": {**SMALL, "num_frames": 9}}
    try:
        with pytest.raises(OutOfGPUMemory):
            loop.run(generator.run(Job("oom", payload, [], emit=lambda _: None)))
    finally:
        hook.remove()
    assert calls[0] == 2
    assert all(feature is None for feature in vae._feat_map), "the failed decode's features"
    loop.run(generator.close())
    loop.loop.call_soon_threadsafe(loop.loop.stop)


def test_a_static_cache_grown_for_a_turn_that_ran_out_of_memory_shrinks_back(
        static_reasoner: Any, monkeypatch: Any) -> None:
    """A long turn grows the cache, then runs out of memory (seen on an H200: a 60 s clip's
    turn left the Reasoner 1.15 GiB over its level before it, and the next small request ran out
    of memory in that gap): the cache goes back to its size before the turn."""
    engine = static_reasoner
    run(engine, "small", plain(turns(0)), FRAMES[:1])
    before = engine.decoder.capacity
    grown: list[int] = []

    def step_out_of_memory(*_: Any) -> Any:
        grown.append(engine.decoder.capacity)
        raise torch.OutOfMemoryError(OOM_TEXT)

    long_reply = {**plain(turns(0)), "sampling": {"temperature": 0.0, "max_tokens": 4000}}
    monkeypatch.setattr(engine.decoder, "step", step_out_of_memory)
    with pytest.raises(OutOfGPUMemory):
        run(engine, "grows", long_reply, FRAMES[:1])
    monkeypatch.undo()
    assert grown and grown[0] > before, (before, grown)  # the turn did grow it
    assert engine.decoder.capacity == before, "the failed turn's cache growth is still held"
    assert run(engine, "after", plain(turns(0)), FRAMES[:1])["text"]
