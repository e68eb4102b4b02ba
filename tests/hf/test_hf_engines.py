"""The hf engines in-process on the tiny checkpoint: real pipeline output, option checks,
constrained decisions, streaming, and cancellation within one step / one token."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.contract.result import StageResult  # noqa: E402
from sglang_omni.engines.hf import HFGenerator, HFReasoner  # noqa: E402
from sglang_omni.errors import BadRequest  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402

SMALL = {"width": 64, "height": 64, "num_inference_steps": 2}


def spec(role: str, root: Path, **engine: Any) -> EngineSpec:
    return EngineSpec(stage=role, role=role, backend="hf", model_path=str(root), gpu=None,
                      gpu_memory_fraction=None, factory={}, engine=engine)


class Loop:
    """One event loop on a thread for the module, so engines stay loaded between tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@pytest.fixture(scope="module")
def engines(tiny_checkpoint: Path) -> Any:
    loop = Loop()
    reasoner = HFReasoner(spec("reasoner", tiny_checkpoint, max_structured_tokens=80))
    generator = HFGenerator(spec("generation", tiny_checkpoint))
    loop.run(reasoner.start())
    loop.run(generator.start())
    yield loop, reasoner, generator
    loop.run(reasoner.close())
    loop.run(generator.close())
    loop.loop.call_soon_threadsafe(loop.loop.stop)


def run_job(loop: Loop, engine: Any, payload: dict, frames: list[bytes] | None = None,
            emit: Any = None) -> tuple[StageResult, list[dict]]:
    chunks: list[dict] = []
    job = Job("r1", payload, frames or [], emit=emit or chunks.append)
    return loop.run(engine.run(job)), chunks


def test_image_and_video_with_sound_come_from_the_real_pipeline(engines: Any) -> None:
    import av
    from PIL import Image

    loop, _, generator = engines
    image, steps = run_job(loop, generator, {"modality": "image", "prompt": "a red cube",
                                             "options": {**SMALL, "seed": 3}})
    assert image.payload == {"media": [{"kind": "image", "mime_type": "image/png", "frame": 0}],
                             "reason": None}
    assert Image.open(io.BytesIO(image.frames[0])).size == (64, 64)
    assert steps == [{"step": 1, "steps": 2}, {"step": 2, "steps": 2}]
    again, _ = run_job(loop, generator, {"modality": "image", "prompt": "a red cube",
                                         "options": {**SMALL, "seed": 3}})
    assert again.frames[0] == image.frames[0]  # seeded: bit-identical
    video, _ = run_job(loop, generator, {"modality": "video", "prompt": "a red cube", "options": {
        **SMALL, "width": 96, "num_frames": 9, "fps": 8, "generate_sound": True}})
    assert video.payload["media"][0]["mime_type"] == "video/mp4"
    with av.open(io.BytesIO(video.frames[0])) as container:
        kinds = sorted(s.type for s in container.streams)
        frames = list(container.decode(video=0))
    assert kinds == ["audio", "video"]
    assert len(frames) == 9 and (frames[0].width, frames[0].height) == (96, 64)


@pytest.mark.parametrize(("options", "message"), [
    ({"width": 100}, "width: the hf backend needs a multiple of 16"),
    ({"output_path": "x"}, "output_path: not accepted"),
    ({"num_inference_steps": 0}, "expected a positive integer"),
    ({"bogus": 1}, "not an option of the native image and video routes"),
    ({"action_mode": "forward_dynamics"}, "no action head"),
])
def test_options_are_checked_like_the_native_routes(engines: Any, options: dict,
                                                   message: str) -> None:
    loop, _, generator = engines
    with pytest.raises(BadRequest, match=message):
        run_job(loop, generator, {"modality": "video", "prompt": "x",
                                  "options": {**SMALL, **options}})


def test_cancelled_generation_stops_within_one_denoising_step(engines: Any) -> None:
    """The abort lands while step 3 runs; step 4 never starts and the VAE never decodes."""
    loop, _, generator = engines
    pipe = generator.pipe
    forwards: list[int] = []
    hook = pipe.transformer.register_forward_hook(lambda *_: forwards.append(1))
    decodes: list[int] = []
    original_decode = pipe.vae.decode
    pipe.vae.decode = lambda *a, **k: decodes.append(1) or original_decode(*a, **k)
    job_box: list[Job] = []
    seen: list[dict] = []

    def emit(chunk: dict) -> None:  # from the model thread, like the stage's sender
        seen.append(chunk)
        if chunk["step"] == 2:
            threading.Timer(0.0, job_box[0].cancelled.set).start()
            forwards_at_cancel.append(len(forwards))

    forwards_at_cancel: list[int] = []
    job = Job("cancel", {"modality": "image", "prompt": "x",
                         "options": {**SMALL, "num_inference_steps": 50}}, [], emit=emit)
    job_box.append(job)
    try:
        with pytest.raises(Exception) as caught:
            loop.run(generator.run(job))
    finally:
        hook.remove()
        pipe.vae.decode = original_decode
    assert type(caught.value).__name__ == "JobCancelled"
    assert [c["step"] for c in seen] == [1, 2]
    assert len(forwards) - forwards_at_cancel[0] <= 2  # at most one more step (cond + uncond)
    assert decodes == []
    image, _ = run_job(loop, generator, {"modality": "image", "prompt": "x", "options": SMALL})
    assert image.payload["media"]  # the pipeline stays usable


def decide(loop: Loop, reasoner: HFReasoner, messages: list, frames: list[bytes],
           modalities: tuple[str, ...] = ("image", "video"), **sampling: Any) -> tuple:
    payload = {"messages": messages, "sampling": {"temperature": 0.0, **sampling},
               "response_format": decision.response_format(modalities), "stream": True,
               "turn_index": 0}
    return run_job(loop, reasoner, payload, frames)


def test_decisions_are_valid_json_and_stream(engines: Any) -> None:
    loop, reasoner, generator = engines
    image, _ = run_job(loop, generator, {"modality": "image", "prompt": "x", "options": SMALL})
    video, _ = run_job(loop, generator, {"modality": "video", "prompt": "x",
                                         "options": {**SMALL, "num_frames": 5}})
    messages = [{"role": "user", "content": "Draw a cube, look at it, then answer."},
                {"role": "assistant", "content": '{"decision":"generate_image","prompt":"x"}'},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "omni-frame://0"}},
                    {"type": "video_url", "video_url": {"url": "omni-frame://1"}},
                    {"type": "text", "text": "Generated."}]}]
    for seed in range(4):
        result, chunks = decide(loop, reasoner, messages, [image.frames[0], video.frames[0]],
                                temperature=1.0, seed=seed)
        decision.parse(result.payload["text"])  # raises unless it is a valid decision
        assert chunks[0] == {"text": ""}  # accepted
        assert "".join(c["text"] for c in chunks) == result.payload["text"]
        assert result.payload["finish_reason"] == "stop"
        assert result.payload["usage"]["completion_tokens"] <= 80
    final_only, _ = decide(loop, reasoner, messages, [image.frames[0], video.frames[0]], ())
    assert json.loads(final_only.payload["text"])["decision"] == "final_answer"


def test_abort_stops_decoding_at_the_next_token(engines: Any) -> None:
    loop, reasoner, _ = engines
    box: list[Job] = []
    chunks: list[dict] = []

    def emit(chunk: dict) -> None:
        chunks.append(chunk)
        if len(chunks) == 4:
            box[0].cancelled.set()

    job = Job("abort", {"messages": [{"role": "user", "content": "talk"}],
                        "sampling": {"max_tokens": 400, "min_tokens": 400}, "stream": True},
              [], emit=emit)
    box.append(job)
    with pytest.raises(Exception) as caught:
        loop.run(reasoner.run(job))
    assert type(caught.value).__name__ == "JobCancelled"
    assert len(chunks) <= 5


def test_plain_chat_honours_length_and_logprobs(engines: Any) -> None:
    loop, reasoner, _ = engines
    result, _ = run_job(loop, reasoner, {
        "messages": [{"role": "user", "content": "hello"}],
        "sampling": {"max_tokens": 6, "min_tokens": 6}, "stream": False,
        "options": {"logprobs": True, "top_logprobs": 2}})
    assert result.payload["finish_reason"] == "length"
    assert result.payload["usage"]["completion_tokens"] == 6
    content = result.payload["logprobs"]["content"]
    assert len(content) == 6 and len(content[0]["top_logprobs"]) == 2
    with pytest.raises(BadRequest, match="not supported by the hf Reasoner"):
        run_job(loop, reasoner, {"messages": [{"role": "user", "content": "x"}],
                                 "sampling": {"regex": "a+"}})


def test_frames_become_the_same_bytes_in_place() -> None:
    """``to_uint8`` (in place, no full-size temporaries) gives what the reference expression
    gives, halves and out-of-range values included."""
    import numpy as np

    from sglang_omni.engines.hf.common import to_uint8

    values = np.array([-0.5, 0.0, 0.5 / 255, 1.5 / 255, 2.5 / 255, 0.5, 254.5 / 255, 1.0, 7.0],
                      dtype=np.float32)
    video = np.random.default_rng(0).random((3, 8, 8, 3), dtype=np.float32)
    video[0, 0, :, 0] = np.resize(values, 8)
    expected = (np.clip(video, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    readonly = video.copy()
    readonly.flags.writeable = False
    assert np.array_equal(to_uint8(readonly), expected)
    assert np.array_equal(to_uint8(video.copy()), expected)
