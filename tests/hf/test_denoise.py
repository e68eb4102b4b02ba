"""The fast denoising loop (``engines.hf.denoise``; the GPU's path, run here on the CPU without
graphs) against stock ``Cosmos3OmniPipeline.__call__`` on the tiny checkpoint, same seed:
text-to-image, text-to-video, image-to-video, with and without guidance, batched or not; in
float32 the outputs agree to rounding, in bfloat16 within bfloat16 tolerance."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFGenerator, denoise  # noqa: E402


def pipeline(root: Path, dtype: str) -> Any:
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(root, dtype=getattr(torch, dtype),
                                             enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def pipes(tiny_checkpoint: Path) -> dict[str, Any]:
    return {"float32": pipeline(tiny_checkpoint, "float32"),
            "bfloat16": pipeline(tiny_checkpoint, "bfloat16")}


def both(pipe: Any, seed: int = 3, **kwargs: Any) -> tuple[Any, Any, list[int]]:
    import torch

    call = {"prompt": "a red cube on a table", "height": 64, "width": 96, "num_frames": 1,
            "num_inference_steps": 3, "output_type": "np", **kwargs}
    stock = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed)).video
    steps: list[int] = []

    def on_step_end(_pipe: Any, index: int, _t: Any, tensors: dict) -> dict:
        steps.append(index)
        return {}

    encodes: list[int] = []
    encode = pipe.vae.encode
    pipe.vae.encode = lambda *a, **k: encodes.append(1) or encode(*a, **k)
    try:
        fast = denoise.generate(pipe, call, torch.Generator("cpu").manual_seed(seed),
                                on_step_end).video
    finally:
        pipe.vae.encode = encode
    assert steps == list(range(call["num_inference_steps"]))
    return stock, fast, encodes


def test_text_to_image_and_video_match_stock_in_float32(pipes: dict[str, Any]) -> None:
    import numpy as np

    pipe = pipes["float32"]
    for extra in ({}, {"num_frames": 9, "fps": 8.0}, {"guidance_scale": 1.0},
                  {"negative_prompt": "blurry, dark"}):
        stock, fast, encodes = both(pipe, **extra)
        assert stock.shape == fast.shape
        assert np.abs(stock - fast).max() < 1e-4, extra
        assert encodes == []  # no VAE encode of an all-zero video


def test_image_to_video_matches_stock(pipes: dict[str, Any]) -> None:
    import numpy as np
    from PIL import Image

    image = Image.fromarray((np.random.default_rng(0).random((64, 96, 3)) * 255).astype("uint8"))
    stock, fast, encodes = both(pipes["float32"], num_frames=9, image=image)
    assert np.abs(stock - fast).max() < 1e-4
    assert encodes == [1]  # the conditioning frame is encoded, as stock does


def test_unbatched_guidance_passes_match_stock(pipes: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setattr(denoise, "BATCH_MAX_TOKENS", 0)
    stock, fast, _ = both(pipes["float32"], num_frames=5)
    assert np.abs(stock - fast).max() < 1e-4


def test_bfloat16_matches_stock_within_bfloat16_tolerance(pipes: dict[str, Any]) -> None:
    import numpy as np

    for extra in ({}, {"num_frames": 9}):
        stock, fast, _ = both(pipes["bfloat16"], **extra)
        diff = np.abs(stock.astype(np.float64) - fast.astype(np.float64))
        assert diff.mean() < 1e-2 and diff.max() < 0.1, (diff.mean(), diff.max())


def test_unsupported_requests_are_named(pipes: dict[str, Any]) -> None:
    pipe = pipes["float32"]
    assert denoise.unsupported(pipe, {"prompt": "x", "enable_sound": True}) == "sound generation"
    assert "arguments" in denoise.unsupported(pipe, {"prompt": "x", "latents": None})
    assert denoise.unsupported(pipe, {"prompt": "x", "enable_safety_check": True}) is None


def test_the_engine_runs_the_fast_loop_when_asked(tiny_checkpoint: Path) -> None:
    spec = EngineSpec(stage="generation", role="generation", backend="hf",
                      model_path=str(tiny_checkpoint), gpu=None, gpu_memory_fraction=None,
                      factory={}, engine={"denoiser": "fast"})
    engine = HFGenerator(spec)
    asyncio.run(engine.start())
    try:
        assert engine.fast
        chunks: list[dict] = []
        job = Job("f", {"modality": "image", "prompt": "a cube",
                        "options": {"width": 64, "height": 64, "num_inference_steps": 2}},
                  [], emit=chunks.append)
        result = asyncio.run(engine.run(job))
        assert result.payload["media"][0]["mime_type"] == "image/png"
        assert chunks == [{"step": 1, "steps": 2}, {"step": 2, "steps": 2}]
    finally:
        asyncio.run(engine.close())
    with pytest.raises(RuntimeError, match="denoiser"):
        HFGenerator(spec.__class__(**{**spec.__dict__, "engine": {"denoiser": "turbo"}}))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_chunked_vae_decode_equals_a_whole_decode_bit_for_bit(pipes: dict[str, Any],
                                                                 dtype: str) -> None:
    """``decode_chunks`` hands over the VAE's frames one latent frame at a time (1, then 4
    each) and together they are exactly the frames of one whole ``vae.decode``."""
    import numpy as np
    import torch

    pipe = pipes[dtype]
    vae = pipe.vae.config
    latents = torch.randn((1, int(vae.z_dim), 3, 4, 6), generator=torch.Generator("cpu")
                          .manual_seed(5))
    chunks: list[Any] = []
    with torch.no_grad():
        count = denoise.decode_chunks(pipe, latents, chunks.append)
        whole = denoise._decode(pipe, latents, "np")
    assert [len(c) for c in chunks] == [1, 4, 4] and count == 9
    assert np.array_equal(np.concatenate(chunks), whole)


def test_the_engine_encodes_a_video_as_its_frames_are_decoded(tiny_checkpoint: Path) -> None:
    """The fast loop's video: its MP4 is the same bytes as the whole decode's frames encoded
    at once, and it was fed chunk by chunk (the ``encode`` span is the time after the last)."""
    from sglang_omni.engines.hf.common import to_uint8
    from sglang_omni.engines.video_delivery import StreamingMp4
    from sglang_omni.media.encode import encode_mp4

    spec = EngineSpec(stage="generation", role="generation", backend="hf",
                      model_path=str(tiny_checkpoint), gpu=None, gpu_memory_fraction=None,
                      factory={}, engine={"denoiser": "fast"})
    engine = HFGenerator(spec)
    asyncio.run(engine.start())
    fed: list[int] = []
    add = StreamingMp4.add

    def counting(self: StreamingMp4, frames: Any) -> None:
        fed.append(len(frames))
        add(self, frames)

    try:
        payload = {"modality": "video", "prompt": "a cube", "options": {
            "width": 64, "height": 64, "num_inference_steps": 2, "num_frames": 9, "fps": 8}}
        job = Job("v", payload, [], emit=lambda _: None)
        StreamingMp4.add = counting  # type: ignore[method-assign]
        try:
            result = asyncio.run(engine.run(job))
        finally:
            StreamingMp4.add = add  # type: ignore[method-assign]
        assert fed == [1, 4, 4]
        assert {"denoise", "vae_decode", "encode"} <= set(job.spans)
        call = engine._plan("video", "a cube", payload["options"])
        frames, _ = engine._denoise(Job("w", payload, [], emit=lambda _: None), call)
        assert result.frames[0] == encode_mp4(list(to_uint8(frames)), 8,
                                              encoding=engine.encoding)
    finally:
        asyncio.run(engine.close())
