"""A faster denoising loop over diffusers' Cosmos3 modules (transformer, VAE, scheduler).

Stock ``Cosmos3OmniPipeline.__call__`` runs the whole transformer twice a step (the prompt and
the negative prompt), each time recomputing the understanding (text) pathway, although text
never attends to the generation tokens, and it VAE-encodes an all-zero video for text-to-video
only to learn the latent shape. ``generate`` here computes the same thing differently:

* the text pathway runs once per prompt per request, keeping each layer's K/V as the
  generation tokens see them (``k_norm_und_for_gen`` and rotary embedding applied);
* a step runs the generation pathway alone, the prompt and negative-prompt passes as one batch
  of two through the projections and MLPs (each attends to its own text K/V at its own
  positions), or one after the other when the batch would be large (``BATCH_MAX_TOKENS``);
* on a GPU that step is captured into a CUDA graph on the first denoising step and replayed;
* text-to-image and text-to-video draw their noise directly (the shape the VAE would give).

Prompt templates, tokenization, packing, positions, noise, conditioning frames, the scheduler,
classifier-free guidance, masking and the VAE decode are the pipeline's own methods, called as
``__call__`` calls them, so the output equals stock within bfloat16 rounding (the tests compare
them). ``unsupported`` names what this loop does not do (sound, actions, guardrails, quantised
transformers); the engine runs stock ``__call__`` for those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.contract.generation_options import DEFAULT_STEPS
from sglang_omni.engines.hf.common import log
from sglang_omni.engines.memory_faults import is_out_of_memory

BATCH_MAX_TOKENS = 32768
SUPPORTED_KWARGS = {"prompt", "negative_prompt", "height", "width", "num_frames", "fps",
                    "num_inference_steps", "guidance_scale", "image", "video", "enable_sound",
                    "output_type", "enable_safety_check"}


@dataclass
class Output:
    """As ``Cosmos3OmniPipelineOutput``: ``video`` per ``output_type``; never a sound track.
    ``streamed``: frames handed to ``on_frames`` instead (``video`` is then None)."""

    video: Any
    sound: None = None
    streamed: int = 0


def unsupported(pipe: Any, kwargs: dict[str, Any]) -> str | None:
    """Why this loop cannot run these ``__call__`` arguments, or None when it can."""
    extra = set(kwargs) - SUPPORTED_KWARGS
    if extra:
        return f"arguments {sorted(extra)}"
    if kwargs.get("enable_sound"):
        return "sound generation"
    if pipe.safety_checker is not None and kwargs.get("enable_safety_check", True):
        return "the Cosmos guardrails"
    transformer = pipe.transformer
    if getattr(transformer, "hf_quantizer", None) is not None or getattr(
            transformer.config, "quantization_config", None):
        return "a quantised transformer"
    if transformer._cp_shard_fn is not None or transformer._cp_gather_fn is not None:
        return "context parallelism"
    return None


def generate(pipe: Any, kwargs: dict[str, Any], generator: Any, on_step_end: Any = None,
             graphs: bool = False, on_frames: Any = None, scheduler: Any = None,
             pause: Any = None) -> Output:
    """``pipe(**kwargs, generator=..., callback_on_step_end=on_step_end)`` for what
    ``unsupported`` allows, computed as the module docstring says. With ``on_frames`` and
    ``output_type`` ``np``, the frames go to ``on_frames`` as the VAE decodes them
    (:func:`decode_chunks`) and the output carries their count.

    ``scheduler``: the call's own scheduler (default ``pipe.scheduler``); with one of its own
    the call keeps no state on ``pipe`` across steps, so ``pause(kept_bytes, step, steps)``,
    called between two steps, may block while other calls run on ``pipe`` and the call
    continues exactly where it stopped (``kept_bytes``: what it holds on the device)."""
    import numpy as np
    import torch

    reason = unsupported(pipe, kwargs)
    if reason is not None:
        raise ValueError(f"the fast denoising loop does not handle {reason}")
    prompt, negative = kwargs["prompt"], kwargs.get("negative_prompt")
    image, video = kwargs.get("image"), kwargs.get("video")
    frames, height, width = kwargs["num_frames"], kwargs["height"], kwargs["width"]
    fps = float(kwargs.get("fps", 24.0))
    steps = int(kwargs.get("num_inference_steps", DEFAULT_STEPS))
    guidance = float(kwargs.get("guidance_scale", 6.0))
    with torch.no_grad():
        pipe.check_inputs(prompt, negative, image, height, width, frames, guidance, False,
                          ["latents"], None, video=video, condition_frame_indexes_vision=(0, 1))
        pipe._current_timestep = None
        pipe._interrupt = False
        pipe._guidance_scale = guidance
        device = pipe._get_execution_device()
        cond_ids, uncond_ids = pipe.tokenize_prompt(
            prompt, negative, num_frames=frames, height=height, width=width, fps=fps)
        texts = [pipe._prepare_text_segment(cond_ids, device=device)]
        if pipe.do_classifier_free_guidance:
            texts.append(pipe._prepare_text_segment(uncond_ids, device=device))
        latents, mask = _initial_latents(pipe, kwargs, generator, device)
        conditioned = [int(i) for i in torch.nonzero(mask[:, 0, 0] > 0).flatten().tolist()]
        segments = [pipe._prepare_vision_segment(
            input_vision_tokens=latents, has_image_condition=bool(conditioned),
            mrope_offset=text["vision_start_temporal_offset"], vision_fps=fps,
            curr=text["und_len"], device=device, condition_frame_indexes=conditioned)
            for text in texts]
        scheduler = pipe.scheduler if scheduler is None else scheduler
        if pipe.config.use_native_flow_schedule:
            train = scheduler.config.num_train_timesteps
            sigmas = np.linspace(1.0 - 1.0 / train, 0.0, steps + 1)[:-1]
            scheduler.set_timesteps(steps, device=device, sigmas=sigmas)
        else:
            scheduler.set_timesteps(steps, device=device)
        timesteps = scheduler.timesteps
        pipe._num_timesteps = len(timesteps)
        step = GenerationStep(pipe.transformer, texts, segments, latents, graphs)
        noisy = segments[0]["num_noisy_vision_tokens"]
        for i, t in enumerate(timesteps):
            pipe._current_timestep = t
            preds = step(latents, float(t.item()), noisy)
            velocities = [pipe._mask_velocity_predictions([p], None, [mask])[0].float()
                          for p in preds]
            velocity = velocities[0]
            if len(velocities) == 2:
                velocity = velocities[1] + guidance * (velocities[0] - velocities[1])
            latents = scheduler.step(velocity.unsqueeze(0), t, latents.unsqueeze(0),
                                     return_dict=False)[0].squeeze(0)
            if on_step_end is not None:
                outputs = on_step_end(pipe, i, t, {"latents": latents})
                latents = outputs.pop("latents", latents).float()
            if pause is not None and i + 1 < len(timesteps):
                pause(step.held_bytes() + _nbytes(latents) + _nbytes(mask), i + 1,
                      len(timesteps))
        step.close()
        pipe._current_timestep = None
        output_type = kwargs.get("output_type", "pil")
        if on_frames is not None and output_type == "np":
            return Output(None, streamed=decode_chunks(pipe, latents, on_frames))
        return Output(_decode(pipe, latents, output_type))


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


def _initial_latents(pipe: Any, kwargs: dict[str, Any], generator: Any,
                     device: Any) -> tuple[Any, Any]:
    """(latents, conditioning mask) as ``prepare_latents`` makes them. Without a conditioning
    image or video the mask is all zeros, so the latents are the noise alone: drawn here at
    the VAE's latent shape, without encoding an all-zero video."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    frames = kwargs["num_frames"]
    if kwargs.get("image") is None and kwargs.get("video") is None:
        vae = pipe.vae.config
        shape = (1, int(vae.z_dim), (frames - 1) // int(vae.scale_factor_temporal) + 1,
                 kwargs["height"] // int(vae.scale_factor_spatial),
                 kwargs["width"] // int(vae.scale_factor_spatial))
        noise = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        return noise, torch.zeros((shape[2], 1, 1), device=device, dtype=torch.float32)
    made = pipe.prepare_latents(
        image=kwargs.get("image"), video=kwargs.get("video"), num_frames=frames,
        height=kwargs["height"], width=kwargs["width"], fps=float(kwargs.get("fps", 24.0)),
        generator=generator, device=device, dtype=torch.float32)
    return made[0], made[5]


def _raw_latents(pipe: Any, latents: Any) -> Any:
    """``latents`` in the VAE's own scale, as the pipeline hands them to ``vae.decode``."""
    dtype = pipe.vae.dtype
    mean = pipe._vae_latents_mean.to(device=latents.device, dtype=dtype)
    inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=dtype)
    return latents.to(dtype) / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)


def _decode(pipe: Any, latents: Any, output_type: str) -> Any:
    if output_type == "latent":
        return latents
    decoded = pipe.vae.decode(_raw_latents(pipe, latents)).sample.to(latents.dtype)
    video = pipe.video_processor.postprocess_video(decoded, output_type=output_type)[0]
    pipe.maybe_free_model_hooks()
    return video


def chunkable(vae: Any, latents: Any) -> bool:
    """Whether ``vae`` decodes ``latents`` one latent frame at a time with its causal cache
    (diffusers' ``AutoencoderKLWan``, which Cosmos3 uses, untiled), so that
    :func:`decode_chunks` can run that loop itself."""
    needed = ("decoder", "post_quant_conv", "clear_cache", "_cached_conv_counts")
    if not all(hasattr(vae, name) for name in needed):
        return False
    if getattr(vae, "use_tiling", False):
        ratio = int(getattr(vae, "spatial_compression_ratio", 1))
        height, width = latents.shape[-2:]
        if width > vae.tile_sample_min_width // ratio or \
                height > vae.tile_sample_min_height // ratio:
            return False
    return True


def decode_chunks(pipe: Any, latents: Any, on_frames: Any) -> int:
    """Decode ``latents`` to frames in [0, 1] (``output_type`` ``np``: an array of (frames,
    height, width, 3)), handing each latent frame's frames to ``on_frames`` as soon as the VAE
    has made them (1 frame, then 4 each for Cosmos3's VAE); returns how many frames. The VAE's
    own loop (``AutoencoderKLWan._decode``) with the same calls in the same order, the
    clamping and post-processing done per chunk (elementwise, so the frames equal a whole
    decode's bit for bit); a VAE this cannot split (``chunkable``) decodes whole, handed over
    once."""
    vae = pipe.vae
    if not chunkable(vae, latents):
        video = _decode(pipe, latents, "np")
        on_frames(video)
        return len(video)
    import torch

    count = 0
    vae.clear_cache()
    try:
        x = vae.post_quant_conv(_raw_latents(pipe, latents))
        for index in range(x.shape[2]):
            vae._conv_idx = [0]
            out = vae.decoder(x[:, :, index:index + 1], feat_cache=vae._feat_map,
                              feat_idx=vae._conv_idx, first_chunk=index == 0)
            if vae.config.patch_size is not None:
                from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

                out = unpatchify(out, patch_size=vae.config.patch_size)
            out = torch.clamp(out, min=-1.0, max=1.0).to(latents.dtype)
            frames = pipe.video_processor.postprocess_video(out, output_type="np")[0]
            on_frames(frames)
            count += len(frames)
    finally:
        vae.clear_cache()
    pipe.maybe_free_model_hooks()
    return count


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attention(attn: Any, q: Any, k: Any, v: Any, causal: bool) -> Any:
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    processor = attn.processor
    return dispatch_attention_fn(q, k, v, is_causal=causal, enable_gqa=True,
                                 backend=getattr(processor, "_attention_backend", None),
                                 parallel_config=getattr(processor, "_parallel_config", None))


class GenerationStep:
    """The transformer's velocity for the vision tokens, per prompt (cond, then uncond).

    Holds the text K/V of each prompt (computed at construction) and, on a GPU, the CUDA graph
    of the step with its static input buffers (captured at the first call)."""

    def __init__(self, transformer: Any, texts: list[dict[str, Any]],
                 segments: list[dict[str, Any]], latents: Any, graphs: bool) -> None:
        import torch

        self.transformer = transformer
        self.dtype = transformer.embed_tokens.weight.dtype
        first = segments[0]
        self.shapes = first["vision_token_shapes"]
        self.noisy = first["vision_noisy_frame_indexes"]
        # Vision tokens directly follow the text, so rows relative to the generation pathway
        # are the same for both prompts.
        self.rows = first["vision_mse_loss_indexes"] - texts[0]["und_len"]
        self.text_kv = [self._text_kv(text) for text in texts]
        cos, sin = [], []
        for segment in segments:
            c, s = transformer.rotary_emb(position_ids=segment["vision_mrope_ids"].unsqueeze(1),
                                          device=latents.device, dtype=self.dtype)
            cos.append(c.squeeze(0))
            sin.append(s.squeeze(0))
        self.cos = torch.stack(cos).unsqueeze(2)  # [prompts, tokens, 1, head_dim]
        self.sin = torch.stack(sin).unsqueeze(2)
        tokens = int(self.cos.shape[1])
        self.batched = len(texts) * tokens <= BATCH_MAX_TOKENS
        self.graphs = graphs and latents.device.type == "cuda"
        self.graph: Any = None
        self.inputs: Any = None
        self.outputs: Any = None
        self.graph_pool_bytes = 0  # what the capture added to the device's reserved memory

    def __call__(self, latents: Any, timestep: float, noisy: int) -> list[Any]:
        import torch

        tokens = latents.to(dtype=self.dtype)
        steps = torch.full((noisy,), timestep, device=latents.device)
        if not self.graphs:
            return self._forward(tokens, steps)
        if self.graph is None:
            try:
                return self._capture(tokens, steps)
            except RuntimeError as exc:  # a capture failure leaves the eager step usable
                if is_out_of_memory(exc):  # the eager step would not fit either
                    raise
                log.warning("hf generator: CUDA graph capture failed (%s); denoising without "
                            "graphs", exc)
                self.graphs, self.graph = False, None
                return self._forward(tokens, steps)
        self.inputs[0].copy_(tokens)
        self.inputs[1].copy_(steps)
        self.graph.replay()
        return list(self.outputs)

    def close(self) -> None:
        self.graph = self.inputs = self.outputs = None
        self.text_kv = []

    def held_bytes(self) -> int:
        """The device bytes this step holds between calls: each prompt's text K/V, the rotary
        tables and, once captured, the graph's buffers and its memory pool."""
        held = [self.cos, self.sin, *(t for kv in self.text_kv for pair in kv for t in pair)]
        for group in (self.inputs, self.outputs):
            held.extend(group or ())
        return sum(_nbytes(t) for t in held) + self.graph_pool_bytes

    def _capture(self, tokens: Any, steps: Any) -> list[Any]:
        """Run the first step eagerly on a side stream (warm-up), then capture the graph."""
        import torch

        self.inputs = (tokens.clone(), steps.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            first = self._forward(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        reserved = torch.cuda.memory_reserved()
        with torch.cuda.graph(graph):
            self.outputs = self._forward(*self.inputs)
        self.graph = graph
        self.graph_pool_bytes = max(0, torch.cuda.memory_reserved() - reserved)
        return first

    # --- the computation ---------------------------------------------------------------------
    def _text_kv(self, text: dict[str, Any]) -> list[tuple[Any, Any]]:
        """Per layer, the prompt's K (as the generation tokens see it) and V."""
        tr = self.transformer
        hidden = tr.embed_tokens(text["input_ids"])
        cos, sin = tr.rotary_emb(position_ids=text["text_mrope_ids"].unsqueeze(1),
                                 device=hidden.device, dtype=hidden.dtype)
        cos, sin = cos.squeeze(0).unsqueeze(1), sin.squeeze(0).unsqueeze(1)
        out = []
        for layer in tr.layers:
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.norm_q(attn.to_q(x).view(-1, attn.num_attention_heads, attn.head_dim))
            k = attn.norm_k(attn.to_k(x).view(-1, attn.num_key_value_heads, attn.head_dim))
            v = attn.to_v(x).view(-1, attn.num_key_value_heads, attn.head_dim)
            k_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            out.append((k_gen * cos + _rotate_half(k_gen) * sin, v))
            causal = _attention(attn, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), True)
            hidden = hidden + attn.to_out(causal.squeeze(0).flatten(-2, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return out

    def _forward(self, tokens: Any, steps: Any) -> list[Any]:
        tr = self.transformer
        packed, original = tr._patchify_and_pack_latents([tokens])
        packed = tr.proj_in(packed)
        time_dtype = next(tr.time_embedder.parameters()).dtype
        embeds = tr.time_embedder(tr.time_proj(steps * tr.config.timestep_scale).to(time_dtype))
        packed = tr._apply_timestep_embeds_to_noisy_tokens(
            packed_tokens=packed, packed_timestep_embeds=embeds.to(self.dtype),
            noisy_frame_indexes=self.noisy, token_shapes=self.shapes).to(self.dtype)
        prompts = list(range(len(self.text_kv)))
        groups = [prompts] if self.batched else [[p] for p in prompts]
        preds = []
        for group in groups:
            gen = packed.unsqueeze(0).expand(len(group), -1, -1)
            for index, layer in enumerate(tr.layers):
                gen = self._layer(layer, index, gen, group)
            out = tr.proj_out(tr.norm_moe_gen(gen)[:, self.rows])
            for row in range(len(group)):
                preds.append(tr._unpatchify_and_unpack_latents(
                    out[row], token_shapes_vision=self.shapes,
                    noisy_frame_indexes_vision=self.noisy, original_latent_shapes=original)[0])
        return preds

    def _layer(self, layer: Any, index: int, gen: Any, group: list[int]) -> Any:
        import torch

        attn = layer.self_attn
        batch, tokens, _ = gen.shape
        x = layer.input_layernorm_moe_gen(gen)
        q = attn.norm_added_q(attn.add_q_proj(x).view(batch, tokens, -1, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(x).view(batch, tokens, -1, attn.head_dim))
        v = attn.add_v_proj(x).view(batch, tokens, -1, attn.head_dim)
        # A slice, not a list index: indexing with a list copies from the host, which a graph
        # capture refuses.
        cos, sin = self.cos[group[0]:group[-1] + 1], self.sin[group[0]:group[-1] + 1]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        outs = []
        for row, prompt in enumerate(group):
            text_k, text_v = self.text_kv[prompt][index]
            keys = torch.cat([text_k, k[row]], dim=0).unsqueeze(0)
            values = torch.cat([text_v, v[row]], dim=0).unsqueeze(0)
            outs.append(_attention(attn, q[row:row + 1], keys, values, False))
        out = torch.cat(outs, dim=0).flatten(-2, -1)
        gen = gen + attn.to_add_out(out)
        return gen + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(gen))
