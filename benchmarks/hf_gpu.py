"""The hf backend with random weights at Cosmos3 Nano's dimensions, on one GPU.

Builds the Reasoner (transformers ``Cosmos3OmniForConditionalGeneration``, Qwen3-VL-8B-sized:
hidden 4096, 36 layers, 32 heads, 8 KV heads, vocabulary 151936, a 27-block ViT) and the
generation tower (diffusers ``Cosmos3OmniTransformer`` at its Nano defaults, a Wan2.2-sized VAE
with 48 latent channels) directly on the device in bfloat16 with random weights, hands them to
the hf engines (``HFReasoner`` / ``HFGenerator``, the code the stage processes run), and times:

* a 640x640 image and a 640x640 33-frame video, per denoising step (CFG on: two transformer
  passes a step) and the VAE decode;
* Reasoner decoding in tokens per second, plain and under the decision JSON schema;
* how many denoising steps run after an abort, and how long the abort takes to land.

The tokenizer and processor come from the tiny checkpoint (418 tokens; the model's embedding
table still has Nano's 151936 rows). ``--tiny`` runs the same code at the tiny dimensions on the
CPU, to check the script before spending device time.

    python benchmarks/hf_gpu.py            # on the GPU machine
    python benchmarks/hf_gpu.py --tiny     # anywhere, quickly
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglang_omni.engines.base import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFGenerator, HFReasoner  # noqa: E402
from sglang_omni.engines.hf.common import JobCancelled  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402
from sglang_omni.models.cosmos3.tiny_checkpoint import build_tiny_checkpoint  # noqa: E402

NANO_TEXT = {"model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288,
             "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
             "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                 "mrope_section": [24, 20, 20], "mrope_interleaved": True}}
NANO_VISION = {"model_type": "qwen3_vl_vision", "depth": 27, "hidden_size": 1152,
               "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
               "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096,
               "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}
NANO_VAE = {"base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
            "num_res_blocks": 2}
NANO_TRANSFORMER: dict[str, Any] = {}  # Cosmos3OmniTransformer's defaults are Nano's


def tiny_dims() -> tuple[dict, dict, dict, dict]:
    """The tiny checkpoint's dimensions, to run the same construction code on a CPU."""
    from sglang_omni.models.cosmos3 import tiny_checkpoint as tc

    text = {**tc.TEXT_CONFIG, "vocab_size": 418}
    transformer = {"hidden_size": 64, "head_dim": 16, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
                   "vocab_size": 418, "rope_axes_dim": [4, 2, 2], "latent_channel": 8,
                   "patch_latent_dim": 32}
    vae = {"base_dim": 8, "decoder_base_dim": 8, "z_dim": 8, "dim_mult": [1, 1, 1, 1],
           "num_res_blocks": 1}
    return text, dict(tc.VISION_CONFIG), transformer, vae


def spec(role: str, root: Path, gpu: int | None, **engine: Any) -> EngineSpec:
    return EngineSpec(stage=role, role=role, backend="hf", model_path=str(root), gpu=gpu,
                      gpu_memory_fraction=None, factory={}, engine=engine)


def build_reasoner(engine: HFReasoner, text: dict, vision: dict) -> None:
    """Random weights at the given dimensions in place of the checkpoint's."""
    import torch
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    engine._load()  # the tiny checkpoint: processor, tokenizer, token ids, device
    small = engine.model.config
    config = Cosmos3OmniConfig(
        text_config={**text, "pad_token_id": small.text_config.pad_token_id},
        vision_config=dict(vision), image_token_id=small.image_token_id,
        video_token_id=small.video_token_id, vision_start_token_id=small.vision_start_token_id,
        vision_end_token_id=small.vision_end_token_id)
    generation_config = engine.model.generation_config
    del engine.model
    torch.manual_seed(0)
    with torch.device(engine.device):
        torch.set_default_dtype(torch.bfloat16)
        model = Cosmos3OmniForConditionalGeneration(config).eval()
        torch.set_default_dtype(torch.float32)
    model.generation_config = generation_config
    engine.model = model
    engine.vocab_size = model.get_output_embeddings().weight.shape[0]
    engine._vocab = None


def build_generator(engine: HFGenerator, transformer_dims: dict, vae_dims: dict) -> None:
    import torch
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer

    engine._load()
    pipe = engine.pipe
    z = vae_dims["z_dim"]
    torch.manual_seed(1)
    with torch.device(engine.device):
        torch.set_default_dtype(torch.bfloat16)
        transformer = Cosmos3OmniTransformer(**transformer_dims).eval()
        vae = AutoencoderKLWan(
            **vae_dims, temperal_downsample=[False, True, True], is_residual=True, patch_size=2,
            in_channels=12, out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4,
            latents_mean=[0.0] * z, latents_std=[1.0] * z).eval()
        torch.set_default_dtype(torch.float32)
    transformer.time_embedder.float()  # diffusers keeps it in float32
    engine.pipe = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=pipe.text_tokenizer, vae=vae,
        scheduler=pipe.scheduler, sound_tokenizer=None, enable_safety_checker=False)
    engine.pipe.set_progress_bar_config(disable=True)
    engine.has_sound = False
    del pipe


class Clock:
    """Timestamps of each denoising step's end, from the engine's progress chunks."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def emit(self, chunk: dict) -> None:
        if "step" in chunk:
            self.marks.append(time.perf_counter())


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_generation(engine: HFGenerator, modality: str, size: int, frames: int,
                    steps: int) -> dict[str, Any]:
    options = {"width": size, "height": size, "num_frames": frames,
               "num_inference_steps": steps, "seed": 7}
    call = engine._plan(modality, "a red cube on a wooden table, soft light", options)
    clock = Clock()
    job = Job(f"{modality}-{size}", {}, [], emit=clock.emit)
    sync()
    started = time.perf_counter()
    engine._denoise(job, call)
    sync()
    ended = time.perf_counter()
    gaps = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    return {"modality": modality, "size": f"{size}x{size}", "frames": frames, "steps": steps,
            "first_step_s": round(clock.marks[0] - started, 4),
            "step_s_median": round(statistics.median(gaps), 4),
            "step_s_min": round(min(gaps), 4),
            "decode_s": round(ended - clock.marks[-1], 3),
            "total_s": round(ended - started, 3)}


def time_cancel(engine: HFGenerator, size: int, frames: int, step_s: float,
                trials: int) -> dict[str, Any]:
    """Abort at a random point of step 4 of 50 from another thread. Counts the transformer
    passes that start after the abort (a step is two passes with CFG) and whether the VAE
    decoded, and times the abort until the call returns."""
    import random

    rng = random.Random(0)
    passes: list[int] = []
    hook = engine.pipe.transformer.register_forward_pre_hook(lambda *_: passes.append(1))
    after, latency = [], []
    try:
        for trial in range(trials):
            call = engine._plan("video" if frames > 1 else "image", "a cube", {
                "width": size, "height": size, "num_frames": frames,
                "num_inference_steps": 50, "seed": trial})
            marks: list[int] = []
            state: dict[str, float] = {}
            job = Job("cancel", {}, [], emit=marks.append)

            def cancel_later(job: Job = job, state: dict = state, marks: list = marks) -> None:
                while len(marks) < 3:
                    time.sleep(0.0005)
                time.sleep(rng.uniform(0.05, 0.95) * step_s)
                state["at"] = time.perf_counter()
                state["passes_at"] = len(passes)
                job.cancelled.set()

            threading.Thread(target=cancel_later, daemon=True).start()
            try:
                engine._denoise(job, call)
                raise RuntimeError("the generation was not cancelled")
            except JobCancelled:
                pass
            sync()
            latency.append(time.perf_counter() - state["at"])
            after.append(len(passes) - state["passes_at"])
    finally:
        hook.remove()
    return {"size": f"{size}x{size}", "frames": frames, "trials": trials,
            "passes_started_after_abort": after,
            "steps_after_abort_max": max((a + 1) // 2 for a in after),
            "abort_to_return_s_max": round(max(latency), 4),
            "abort_to_return_s_median": round(statistics.median(latency), 4)}


def time_reasoner(engine: HFReasoner, tokens: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    messages = [{"role": "user", "content": "Describe a red cube on a table in detail."}]
    out: dict[str, Any] = {}
    for name, payload in (
        ("plain", {"messages": messages, "stream": False,
                   "sampling": {"max_tokens": tokens, "min_tokens": tokens}}),
        ("decision", {"messages": messages, "stream": False, "sampling": {"temperature": 0.0},
                      "response_format": decision.response_format(("image", "video"))}),
    ):
        loop.run_until_complete(engine.run(Job("warm", payload, [], emit=lambda _: None)))
        sync()
        started = time.perf_counter()
        result = loop.run_until_complete(engine.run(Job(name, payload, [], emit=lambda _: None)))
        sync()
        elapsed = time.perf_counter() - started
        n = result.payload["usage"]["completion_tokens"]
        out[name] = {"tokens": n, "seconds": round(elapsed, 3),
                     "tokens_per_s": round(n / elapsed, 1),
                     "valid_decision": _valid(result.payload["text"]) if name == "decision"
                     else None}
    loop.close()
    return out


def _valid(text: str) -> bool:
    try:
        decision.parse(text)
        return True
    except Exception:  # noqa: BLE001
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions on the CPU")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", help="write the JSON figures here too")
    args = parser.parse_args()
    import torch

    gpu = None if args.tiny or not torch.cuda.is_available() else 0
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if gpu == 0 else "cpu",
                               "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as scratch:
        root = build_tiny_checkpoint(Path(scratch) / "tiny")
        started = time.perf_counter()
        if args.tiny:
            text, vision, transformer, vae = tiny_dims()
        else:
            text, vision, transformer, vae = NANO_TEXT, NANO_VISION, NANO_TRANSFORMER, NANO_VAE
        generator = HFGenerator(spec("generation", root, gpu))
        build_generator(generator, transformer, vae)
        reasoner = HFReasoner(spec("reasoner", root, gpu, max_structured_tokens=256))
        build_reasoner(reasoner, text, vision)
        figures["build_s"] = round(time.perf_counter() - started, 1)
        figures["params_transformer_b"] = round(
            sum(p.numel() for p in generator.pipe.transformer.parameters()) / 1e9, 3)
        figures["params_reasoner_b"] = round(
            sum(p.numel() for p in reasoner.model.parameters()) / 1e9, 3)
        size = 64 if args.tiny else 640
        time_generation(generator, "image", size, 1, 2)  # warm up kernels
        image = time_generation(generator, "image", size, 1, args.steps)
        video = time_generation(generator, "video", size, 33 if not args.tiny else 9,
                                args.steps)
        figures["image"], figures["video"] = image, video
        figures["cancel_image"] = time_cancel(generator, size, 1, image["step_s_median"], 5)
        figures["cancel_video"] = time_cancel(generator, size, 33 if not args.tiny else 9,
                                              video["step_s_median"], 3)
        figures["reasoner"] = time_reasoner(reasoner, 64 if args.tiny else 256)
        if gpu == 0:
            figures["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
