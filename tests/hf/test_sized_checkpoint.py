"""``sgl-omni make-checkpoint``: the sharded real layout at a small shape (``micro``, the code the
Nano build runs): shards and index files, the language model stored once, both libraries load
it with nothing missing, and the hf engines serve from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def micro(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("sized") / "micro"
    done = subprocess.run([sys.executable, "-m", "sglang_omni", "make-checkpoint", "--shape",
                           "micro", "--device", "cpu", str(target)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    assert "checkpoint written" in done.stderr
    return target


def test_sharded_layout_with_the_language_model_stored_once(micro: Path) -> None:
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "chat_template.jinja", "processor_config.json", "model_index.json",
                 "model.safetensors.index.json", "vision_encoder/model.safetensors",
                 "transformer/diffusion_pytorch_model.safetensors.index.json"):
        assert (micro / name).is_file(), name
    shards = sorted(p.name for p in (micro / "transformer").glob("*.safetensors"))
    assert len(shards) > 1 and all("-of-" in s for s in shards)
    root = json.loads((micro / "model.safetensors.index.json").read_text())["weight_map"]
    transformer = json.loads(
        (micro / "transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    for name, file in root.items():
        if file.startswith("transformer/"):  # the Reasoner reads the generator's own shards
            assert file == f"transformer/{transformer['weight_map'][name]}"
        else:
            assert file == "vision_encoder/model.safetensors"
    assert root["embed_tokens.weight"].startswith("transformer/")
    assert "layers.0.mlp_moe_gen.up_proj.weight" not in root  # the generation expert is not
    config = json.loads((micro / "config.json").read_text())
    assert config["architectures"] == ["Cosmos3OmniForConditionalGeneration"]
    assert config["text_config"]["vocab_size"] == 512  # wider than the 418-token tokenizer


def test_both_libraries_load_it_with_shared_weights(micro: Path) -> None:
    import torch
    from diffusers import DiffusionPipeline
    from transformers import AutoModelForImageTextToText

    reasoner, info = AutoModelForImageTextToText.from_pretrained(micro, output_loading_info=True)
    assert not any(info.values()), info
    pipe = DiffusionPipeline.from_pretrained(micro)
    text, generator = reasoner.model.language_model, pipe.transformer
    assert torch.equal(text.embed_tokens.weight, generator.embed_tokens.weight)
    assert torch.equal(text.layers[1].self_attn.o_proj.weight,
                       generator.layers[1].self_attn.to_out.weight)
    assert torch.equal(reasoner.lm_head.weight, generator.lm_head.weight)
    out = pipe(prompt="a cube", height=32, width=32, num_frames=1, num_inference_steps=1,
               output_type="np")
    assert out.video.shape == (1, 32, 32, 3)


def test_unknown_shapes_are_refused(tmp_path: Path) -> None:
    from sglang_omni.models.cosmos3.nano_checkpoint import build_checkpoint

    with pytest.raises(ValueError, match="shape"):
        build_checkpoint(tmp_path / "x", shape="huge")
    done = subprocess.run([sys.executable, "-m", "sglang_omni", "make-checkpoint", "--shape",
                           "huge", str(tmp_path / "y")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_it_says_its_weights_are_random(micro: Path) -> None:
    from sglang_omni.config import random_weights

    note = random_weights.read(micro)
    assert note is not None
    assert "(checkpoint built by sgl-omni make-checkpoint --shape micro --seed 0)" in note.notice
