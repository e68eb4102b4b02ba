"""Seeded random-weight Cosmos3 checkpoints at a chosen shape, in the real layout, sharded.

``nano`` has Cosmos3 Nano's dimensions: a Qwen3-VL-8B-sized Reasoner (hidden 4096, 36 layers, 32
heads, 8 KV heads, vocabulary 151936, a 27-block ViT), the generation tower's
``Cosmos3OmniTransformer`` at its Nano defaults and a Wan2.2-sized VAE with 48 latent channels:
about 33 GB in bfloat16. ``micro`` is the same code at the tiny dimensions with small shards, for
tests; ``tiny`` is ``tiny_checkpoint`` (one file per part, float32, with a sound generator).

Layout (as the real checkpoint and the tiny one)::

    config.json  generation_config.json  model.safetensors.index.json   (transformers, root)
    tokenizer.json  tokenizer_config.json  chat_template.jinja  processor_config.json
    model_index.json                                                    (diffusers, root)
    transformer/diffusion_pytorch_model-0000k-of-0000n.safetensors + its index
    vae/  scheduler/  text_tokenizer/  vision_encoder/model.safetensors

The Reasoner's language model is stored once, in ``transformer/``'s shards beside the generation
expert; the root index points transformers at them and at ``vision_encoder/``. The tokenizer is
the tiny checkpoint's (418 tokens; the embedding table has the shape's vocabulary rows), so
prompts tokenize short. Weights are initialised on the GPU when there is one (module default
initialisation, seeded) and each shard is written as it is reached; the weights are random, so
the model writes gibberish and paints noise at full cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_omni.models.cosmos3 import tiny_checkpoint as tiny

VIT_FILE = "vision_encoder/model.safetensors"
TRANSFORMER_INDEX = "transformer/diffusion_pytorch_model.safetensors.index.json"
TRANSFORMER_FILE = "transformer/diffusion_pytorch_model.safetensors"


@dataclass(frozen=True)
class Shape:
    """A checkpoint's dimensions. ``text`` and ``vision`` are transformers configs; the
    generation transformer takes ``text``'s dimensions (the language model is shared)."""

    text: dict[str, Any]
    vision: dict[str, Any]
    vae: dict[str, Any]
    image_pixels: dict[str, int]
    video_pixels: dict[str, int]
    shard_size: str
    dtype: str = "bfloat16"


NANO = Shape(
    text={"model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288,
          "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
          "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                              "mrope_section": [24, 20, 20], "mrope_interleaved": True}},
    vision={"model_type": "qwen3_vl_vision", "depth": 27, "hidden_size": 1152,
            "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096,
            "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
    vae={"base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
         "num_res_blocks": 2},
    # Qwen3-VL's own pixel budgets: a 640x640 image is 400 visual tokens.
    image_pixels={"shortest_edge": 256 * 256, "longest_edge": 16777216},
    video_pixels={"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32},
    shard_size="5GB",
)
MICRO = Shape(
    text={**tiny.TEXT_CONFIG, "vocab_size": 512},
    vision=dict(tiny.VISION_CONFIG),
    vae={"base_dim": 8, "decoder_base_dim": 8, "z_dim": tiny.LATENT_CHANNELS,
         "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1},
    image_pixels=dict(tiny.IMAGE_PIXELS),
    video_pixels=dict(tiny.VIDEO_PIXELS),
    shard_size="200KB",
    dtype="float32",
)
SHAPES = {"nano": NANO, "micro": MICRO}
SHAPE_NAMES = ("nano", "micro", "tiny")


def build_checkpoint(path: str | Path, shape: str = "nano", seed: int = tiny.DEFAULT_SEED,
                     device: str | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Build the ``shape`` checkpoint into ``path`` (created; FileExistsError when it holds one
    already). ``device``: where the weights are initialised (default: the GPU if any)."""
    if shape == "tiny":
        return tiny.build_tiny_checkpoint(path, seed=seed)
    if shape not in SHAPES:
        raise ValueError(f"shape: expected one of {', '.join(SHAPE_NAMES)}, got {shape!r}")
    return tiny.build_into(path, lambda work: _build(work, SHAPES[shape], seed, device,
                                                     log or (lambda _: None)),
                           built_by=f"sgl-omni make-checkpoint --shape {shape} --seed {seed}")


def _build(root: Path, shape: Shape, seed: int, device: str | None,
           log: Callable[[str], None]) -> None:
    import torch

    started = time.perf_counter()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = tiny.make_tokenizer(seed)
    config = _reasoner_config(shape, tokenizer)
    config.save_pretrained(root)
    _generation_config(tokenizer).save_pretrained(root)
    tiny.save_processor(root, tokenizer, shape.image_pixels, shape.video_pixels)
    dtype = getattr(torch, shape.dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            pipe = _pipeline(shape, tokenizer, seed)
            log(f"generation tower initialised on {device} in "
                f"{time.perf_counter() - started:.1f} s; writing shards")
            pipe.save_pretrained(root, max_shard_size=shape.shard_size)
            llm_names = _reasoner_names(config, set(pipe.transformer.state_dict()))
            del pipe
            torch.manual_seed(seed + 2)
            vit = _vision_tensors(config)
    finally:
        torch.set_default_dtype(previous)
    from safetensors.torch import save_file

    (root / "vision_encoder").mkdir()
    save_file(vit, str(root / VIT_FILE), metadata={"format": "pt"})
    _write_root_index(root, llm_names, vit)
    log(f"checkpoint written in {time.perf_counter() - started:.1f} s")


def _reasoner_config(shape: Shape, tokenizer: Any) -> Any:
    import torch
    from transformers import Cosmos3OmniConfig

    ids = tiny.special_token_ids(tokenizer)
    config = Cosmos3OmniConfig(
        text_config={**shape.text, "pad_token_id": ids["<|endoftext|>"]},
        vision_config=dict(shape.vision),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    config.architectures = ["Cosmos3OmniForConditionalGeneration"]
    config.dtype = getattr(torch, shape.dtype)
    return config


def _generation_config(tokenizer: Any) -> Any:
    from transformers import GenerationConfig

    ids = tiny.special_token_ids(tokenizer)
    return GenerationConfig(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                            pad_token_id=ids["<|endoftext|>"], do_sample=False)


def _pipeline(shape: Shape, tokenizer: Any, seed: int) -> Any:
    """The diffusers pipeline with random weights, on the current default device and dtype."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    text, z = shape.text, shape.vae["z_dim"]
    torch.manual_seed(seed)
    transformer = Cosmos3OmniTransformer(
        hidden_size=text["hidden_size"], head_dim=text["head_dim"],
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=text["num_hidden_layers"], vocab_size=text["vocab_size"],
        rope_theta=text["rope_parameters"]["rope_theta"],
        rope_axes_dim=list(text["rope_parameters"]["mrope_section"]), hidden_act="silu",
        qk_norm_for_text=True, latent_channel=z, latent_patch_size=2, patch_latent_dim=4 * z)
    transformer.time_embedder.float()  # diffusers keeps it in float32
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        **shape.vae, temperal_downsample=[False, True, True], is_residual=True, patch_size=2,
        in_channels=12, out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[0.0] * z, latents_std=[1.0] * z)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=10.0, use_karras_sigmas=False)
    return Cosmos3OmniPipeline(transformer=transformer.eval(), text_tokenizer=tokenizer,
                               vae=vae.eval(), scheduler=scheduler, sound_tokenizer=None,
                               enable_safety_checker=False)


def _reasoner_names(config: Any, generator_names: set[str]) -> list[str]:
    """The Reasoner's language-model tensors under the checkpoint's names (transformers' own
    conversion, on a weightless model); each must be a tensor of the generation transformer."""
    import torch
    from transformers import Cosmos3OmniForConditionalGeneration
    from transformers.modeling_utils import revert_weight_conversion

    with torch.device("meta"):
        model = Cosmos3OmniForConditionalGeneration(config)
    saved = revert_weight_conversion(model, model.state_dict())
    vit = set(model.model.visual.state_dict())
    llm = sorted(k for k in saved if k not in vit)
    missing = [k for k in llm if k not in generator_names]
    if missing or set(saved) != set(llm) | vit:
        raise RuntimeError(f"the Reasoner's tensors do not map onto the generation transformer "
                           f"(first missing: {missing[:3]})")
    return llm


def _vision_tensors(config: Any) -> dict[str, Any]:
    from transformers import AutoModel

    vit = AutoModel.from_config(config.vision_config).eval()
    return {k: v.detach().contiguous() for k, v in vit.state_dict().items()}


def _write_root_index(root: Path, llm_names: list[str], vit: dict[str, Any]) -> None:
    from safetensors import safe_open

    index_path = root / TRANSFORMER_INDEX
    if index_path.is_file():
        shards = json.loads(index_path.read_text())["weight_map"]
        where = {name: f"transformer/{shards[name]}" for name in llm_names}
    else:
        where = {name: TRANSFORMER_FILE for name in llm_names}
    total = sum(t.numel() * t.element_size() for t in vit.values())
    for file in sorted(set(where.values())):
        with safe_open(str(root / file), framework="pt") as handle:
            for name in handle.keys():
                if where.get(name) == file:
                    sl = handle.get_slice(name)
                    total += _nbytes(sl.get_shape(), sl.get_dtype())
    weight_map = {**where, **{name: VIT_FILE for name in vit}}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _nbytes(shape: list[int], dtype: str) -> int:
    size = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8}[dtype]
    for n in shape:
        size *= n
    return size

