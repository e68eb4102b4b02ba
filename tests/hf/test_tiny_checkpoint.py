"""The tiny checkpoint: real layout, shared weights, byte-identical rebuilds, CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_follows_the_real_checkpoint(tiny_checkpoint: Path) -> None:
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
                 "model.safetensors.index.json", "model_index.json"):
        assert (tiny_checkpoint / name).is_file(), name
    index = json.loads((tiny_checkpoint / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"
    for part in ("transformer", "vae", "scheduler", "text_tokenizer", "sound_tokenizer"):
        assert part in index and (tiny_checkpoint / part).is_dir()
    weight_map = json.loads((tiny_checkpoint / "model.safetensors.index.json").read_text())[
        "weight_map"]
    assert set(weight_map.values()) == {"transformer/diffusion_pytorch_model.safetensors",
                                        "vision_encoder/model.safetensors"}
    assert weight_map["embed_tokens.weight"].startswith("transformer/")
    size = sum(p.stat().st_size for p in tiny_checkpoint.rglob("*") if p.is_file())
    assert size < 3_000_000


def test_the_reasoner_weights_are_the_generators_understanding_pathway(
        tiny_checkpoint: Path) -> None:
    import torch
    from diffusers import Cosmos3OmniTransformer
    from transformers import AutoModelForImageTextToText

    reasoner = AutoModelForImageTextToText.from_pretrained(tiny_checkpoint)
    transformer = Cosmos3OmniTransformer.from_pretrained(tiny_checkpoint / "transformer")
    text = reasoner.model.language_model
    assert torch.equal(text.embed_tokens.weight, transformer.embed_tokens.weight)
    assert torch.equal(text.layers[1].mlp.down_proj.weight,
                       transformer.layers[1].mlp.down_proj.weight)


def test_rebuild_is_byte_identical_and_the_cli_builds_it(tiny_checkpoint: Path,
                                                        tmp_path: Path) -> None:
    target = tmp_path / "again"
    done = subprocess.run([sys.executable, "-m", "sglang_omni", "make-tiny-checkpoint",
                           str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    assert digests(target) == digests(tiny_checkpoint)
    again = subprocess.run([sys.executable, "-m", "sglang_omni", "make-tiny-checkpoint",
                            str(target)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a checkpoint" in again.stderr


def test_the_demo_cache_reuses_a_built_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from sglang_omni.models.cosmos3.tiny_checkpoint import cache_key, cached_tiny_checkpoint

    cached = tmp_path / f"tiny-cosmos3-{cache_key()}"
    shutil.copytree(tiny_checkpoint, cached)
    lines: list[str] = []
    assert cached_tiny_checkpoint(tmp_path, log=lines.append) == cached
    assert lines == []  # no build, no progress line
