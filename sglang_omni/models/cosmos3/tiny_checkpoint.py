"""A tiny, seeded, random-weight Cosmos3 checkpoint in the real layout (about 2 MB).

It runs the real model code (transformers' ``Cosmos3OmniForConditionalGeneration`` for the
Reasoner, diffusers' ``Cosmos3OmniPipeline`` for generation) on a CPU in a fraction of a second
per call, so the ``hf`` backend, the demo and the tests run without downloading weights. The
weights are random: the Reasoner writes gibberish and the generator paints noise. Every build
says so in :data:`~sglang_omni.config.random_weights.MARKER` at its root, which a server reads.

Layout (as the real checkpoint)::

    config.json  generation_config.json  model.safetensors.index.json   (transformers, root)
    tokenizer.json  tokenizer_config.json  chat_template.jinja  processor_config.json
    model_index.json                                                    (diffusers, root)
    transformer/  vae/  scheduler/  text_tokenizer/  sound_tokenizer/  vision_encoder/
    sglang_omni_random_weights.json          (the random-weight note, read by the server)

The Reasoner's language model is stored once, in ``transformer/`` beside the generation expert;
the root index points transformers at it and at ``vision_encoder/``. Building is deterministic:
the same seed and library versions give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from sglang_omni.config import random_weights
from sglang_omni.errors import ConfigError

# 2: the random-weight note (a demo checkpoint cached before it is built again, with the note).
FORMAT_VERSION = 2
DEFAULT_SEED = 0
LLM_FILE = "transformer/diffusion_pytorch_model.safetensors"
VIT_FILE = "vision_encoder/model.safetensors"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                  "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                  "<|image_pad|>", "<|video_pad|>"]
PLAIN_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
# The tokenizer's training text: everyday words plus the words of the decision format, so the
# JSON keys and decision names take few tokens.
WORDS = """a an the of and to in on with for from at by is are was be it this that these
red green blue yellow white black orange purple cube sphere cone cylinder ball box table chair
cat dog bird fish tree house car road river sky cloud sun moon star light shadow water fire
small large tall short round square bright dark soft hard old new fast slow left right top
bottom front back near far under over above below inside outside next between behind image
video picture scene frame camera shot view create make draw show look compare describe answer
final prompt decision generate generated image_url video_url inspect then now here there
one two three four five first second third color shape size same different more less very
"generate_image" "generate_video" "final_answer" "decision" "prompt" "answer" {"decision":
""".split()

CHAT_TEMPLATE = """\
{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif part['type'] == 'video' -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif part['type'] == 'text' -%}
{{ part['text'] }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_vl_text", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 2, 2],
                        "mrope_interleaved": True},
}
VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_vl_vision", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
    "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 64, "num_position_embeddings": 64, "deepstack_visual_indexes": [0],
}
LATENT_CHANNELS = 8
# Small pixel budgets keep the Reasoner's visual token counts tiny (a 64x64 image: 4 tokens).
IMAGE_PIXELS = {"shortest_edge": 32 * 32, "longest_edge": 128 * 128}
VIDEO_PIXELS = {"shortest_edge": 32 * 32, "longest_edge": 4 * 128 * 128}


# `sgl-omni serve --demo`: the interleaved pipeline on the CPU with the hf backend. Decisions get
# a small token budget (random weights rarely close a string on their own), generations default
# to 4 denoising steps, and a request makes one generation, then answers (3 dispatches: random
# weights never choose to answer, so a request would otherwise run to the 8-generation cap, eight
# noise images and about 12 MB); a request's own options and the command line's flags win.
DEMO_OVERRIDES: dict[str, Any] = {
    "orchestrator.factory.max_dispatches": 3,
    "config_cls": "Cosmos3UMMPipelineConfig",
    "generation.gpu": None,
    "generation.factory.backend": "hf",
    "generation.engine.defaults": {"num_inference_steps": 4},
    "reasoner.gpu": None,
    "reasoner.factory.backend": "hf",
    "reasoner.engine.max_structured_tokens": 96,
}


def default_cache_dir() -> Path:
    """Where ``sgl-omni serve --demo`` keeps its checkpoint (``$XDG_CACHE_HOME/sglang-omni``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "sglang-omni"


def cache_key(seed: int = DEFAULT_SEED) -> str:
    """Names a build: the builder's format, the seed and the library versions it used."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = (FORMAT_VERSION, seed, *(version(name) for name in (
            "torch", "transformers", "diffusers", "tokenizers", "safetensors")))
    except PackageNotFoundError as exc:
        raise ConfigError(f"the tiny checkpoint needs the hf extra ({exc.name} is missing): "
                          "pip install 'sglang-omni[hf]'") from None
    return hashlib.sha256(repr(versions).encode()).hexdigest()[:12]


def cached_tiny_checkpoint(cache_dir: str | os.PathLike[str] | None = None,
                           seed: int = DEFAULT_SEED, log: Any = None) -> Path:
    """The cached checkpoint for ``seed``, built on first use (``log`` gets a progress line)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"tiny-cosmos3-{cache_key(seed)}"
    if (target / "model_index.json").is_file():
        return target
    if log is not None:
        log(f"building the tiny random-weight Cosmos3 checkpoint in {target} "
            "(once, about 10 s)")
    try:
        return build_tiny_checkpoint(target, seed=seed)
    except FileExistsError:
        return target


def build_tiny_checkpoint(path: str | os.PathLike[str], seed: int = DEFAULT_SEED,
                          sound: bool = True) -> Path:
    """Build the checkpoint into ``path`` (created; must not hold a checkpoint already).

    Writes into a temporary sibling folder first and renames it, so a reader never sees a half
    built checkpoint. Returns ``path``.
    """
    return build_into(path, lambda work: _build(work, seed, sound),
                      built_by=f"sgl-omni make-checkpoint --shape tiny --seed {seed}")


def build_into(path: str | os.PathLike[str], build: Any, built_by: str) -> Path:
    """Run ``build(folder)`` on a temporary sibling of ``path``, note that its weights are
    random (``built_by``: the command that builds it, see
    :mod:`sglang_omni.config.random_weights`), then rename it to ``path``.

    ``path`` must not hold a checkpoint already (FileExistsError); an empty folder is replaced.
    A reader never sees a half built checkpoint; a failed build leaves nothing behind.
    """
    target = Path(path)
    if (target / "model_index.json").exists():
        raise FileExistsError(f"{target} already holds a checkpoint")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".cosmos3-", dir=target.parent))
    try:
        build(work)
        random_weights.record(work, built_by)
        try:
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()  # an empty folder the caller made
            os.replace(work, target)
        except OSError:
            if (target / "model_index.json").exists():  # another process built it meanwhile
                raise FileExistsError(f"{target} already holds a checkpoint") from None
            raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


# --- the build ---------------------------------------------------------------------------------
def _build(root: Path, seed: int, sound: bool) -> None:
    import torch

    torch.manual_seed(seed)
    tokenizer = make_tokenizer(seed)
    reasoner_tensors = _reasoner(root, tokenizer, seed)
    _generator(root, tokenizer, reasoner_tensors, seed, sound)


def make_tokenizer(seed: int) -> Any:
    """The seeded Qwen2-style BPE tokenizer (418 tokens) with the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers import Qwen2Tokenizer

    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + rng.choice(".,!?")
              for _ in range(3000)]
    trainer = BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(PLAIN_ADDED_TOKENS)
    return Qwen2Tokenizer(tokenizer_object=tok, eos_token="<|im_end|>",
                          pad_token="<|endoftext|>", bos_token=None, unk_token=None,
                          chat_template=CHAT_TEMPLATE)


def _reasoner(root: Path, tokenizer: Any, seed: int) -> dict[str, Any]:
    """Save the understanding tower's configs, tokenizer and processor at the root; return its
    tensors under the checkpoint's flat names (saved later, once, beside the generator)."""
    import torch
    from safetensors.torch import load_file
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    ids = special_token_ids(tokenizer)
    config = Cosmos3OmniConfig(
        text_config={**TEXT_CONFIG, "vocab_size": len(tokenizer),
                     "pad_token_id": ids["<|endoftext|>"]},
        vision_config=dict(VISION_CONFIG),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Cosmos3OmniForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        tensors = load_file(os.path.join(scratch, "model.safetensors"))
        for name in ("config.json", "generation_config.json"):
            shutil.copy(os.path.join(scratch, name), root / name)
    save_processor(root, tokenizer, IMAGE_PIXELS, VIDEO_PIXELS)
    return tensors


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    return {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def save_processor(root: Path, tokenizer: Any, image_pixels: dict[str, int],
                   video_pixels: dict[str, int]) -> None:
    """The Qwen3-VL processor (image and video pixel budgets as given) with the tokenizer."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    common = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=dict(image_pixels), **common),
        video_processor=Qwen3VLVideoProcessor(size=dict(video_pixels), cap_pixels_per_frame=True,
                                               **common),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(root)


def _generator(root: Path, tokenizer: Any, reasoner_tensors: dict[str, Any], seed: int,
               sound: bool) -> None:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3AVAEAudioTokenizer,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )
    from safetensors.torch import save_file

    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 1, 1, 1],
        num_res_blocks=1, temperal_downsample=[False, True, True], is_residual=True,
        patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16,
        scale_factor_temporal=4, latents_mean=[0.0] * LATENT_CHANNELS,
        latents_std=[1.0] * LATENT_CHANNELS)
    text = TEXT_CONFIG
    transformer = Cosmos3OmniTransformer(
        hidden_size=text["hidden_size"], head_dim=text["head_dim"],
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=text["num_hidden_layers"], vocab_size=len(tokenizer),
        rope_theta=text["rope_parameters"]["rope_theta"],
        rope_axes_dim=list(text["rope_parameters"]["mrope_section"]), hidden_act="silu",
        qk_norm_for_text=True, latent_channel=LATENT_CHANNELS, latent_patch_size=2,
        patch_latent_dim=2 * 2 * LATENT_CHANNELS, sound_gen=sound, sound_dim=4 if sound else None,
        sound_latent_fps=25.0)
    state = transformer.state_dict()
    llm_names = sorted(k for k in reasoner_tensors if k in state)
    for name in llm_names:  # the Reasoner's weights are the generator's understanding pathway
        if state[name].shape != reasoner_tensors[name].shape:
            raise RuntimeError(f"shape mismatch for shared tensor {name}")
        state[name].copy_(reasoner_tensors[name])
    vit = {k: v.contiguous() for k, v in reasoner_tensors.items() if k not in state}
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=10.0, use_karras_sigmas=False)
    sound_tokenizer = None
    if sound:
        sound_tokenizer = Cosmos3AVAEAudioTokenizer(
            sampling_rate=16000, vocoder_input_dim=4, dec_dim=4, dec_c_mults=(1, 2, 2, 2),
            dec_strides=(4, 4, 5, 8), encoder_enabled=False)
    pipe = Cosmos3OmniPipeline(transformer=transformer, text_tokenizer=tokenizer, vae=vae,
                               scheduler=scheduler, sound_tokenizer=sound_tokenizer,
                               enable_safety_checker=False)
    pipe.save_pretrained(root)
    (root / "vision_encoder").mkdir()
    save_file(vit, str(root / VIT_FILE), metadata={"format": "pt"})
    weight_map = {name: LLM_FILE for name in llm_names}
    weight_map.update({name: VIT_FILE for name in vit})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in reasoner_tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sglang_omni.models.cosmos3.tiny_checkpoint DIR", file=sys.stderr)
        return 2
    print(build_tiny_checkpoint(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
