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
