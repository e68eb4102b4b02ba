"""The hf generator: diffusers' ``Cosmos3OmniPipeline`` behind the ``Engine`` interface.

Images are PNG, videos H.264 MP4, with an AAC sound track when ``generate_sound`` (or
``sound_duration``) asks for one and the checkpoint has a sound generator. Options are checked
as for the native routes, plus what this backend needs (sizes are multiples of 16).

Cancellation: ``callback_on_step_end`` runs after every denoising step; it raises when the job
is cancelled, which stops the call at once (no further step, no VAE decode) and leaves the
pipeline usable. It also emits ``{"step", "steps"}`` progress. One pipeline object must not run
two calls at once: the stage's GPU turns (``contract.gpu_turns``) let one job compute at a time.
The fast loop, with a scheduler of its own per call, offers a step boundary between two steps:
the job may pause there for an older request's job (on a thread of its own, its latents, text
K/V and captured step kept on the device) and resume where it stopped, with the same output
bytes. Stock ``__call__`` keeps its state on the pipeline and never pauses.

Denoising: on a GPU, ``denoise.generate`` (the text pathway once per request, the two guidance
passes batched, the step replayed as a CUDA graph; outputs equal to stock within bfloat16
rounding) where it applies, stock ``__call__`` elsewhere (sound, guardrails) and on the CPU. On a
GPU the engine warms up before it reports ready (a small image and video).

Engine options (``stages.generation.engine``): ``dtype`` (auto: float32 on the CPU, bfloat16 on
a GPU), ``defaults`` (generation options used where a request leaves them unset, e.g.
``{num_inference_steps: 4}`` for a CPU demo) and ``denoiser`` (``auto``: ``fast`` on a GPU,
``stock`` on the CPU).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sglang_omni.contract.encoding_settings import video_encoding
from sglang_omni.contract.generation_options import (
    DEFAULT_FPS,
    DEFAULT_SEED,
    DEFAULT_SIZE,
    DEFAULT_STEPS,
    DEFAULT_VIDEO_FRAMES,
    HF_SIZE_MULTIPLE,
    check_generation_options,
)
from sglang_omni.contract.gpu_turns import MAX_PAUSED
from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.payloads import GenerationPayload, MediaResult
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.base import check_checkpoint_folder
from sglang_omni.engines.guardrails import guardrails_state
from sglang_omni.engines.hf import denoise
from sglang_omni.engines.hf.action import run_action, wants_action
from sglang_omni.engines.hf.classes import pipeline_class
from sglang_omni.engines.hf.common import (
    JobCancelled,
    ModelThread,
    ThreadedModelEngine,
    engine_options,
    log,
    step_callback,
    to_uint8,
    torch_device,
    torch_dtype,
)
from sglang_omni.engines.hf.conversation import decode_image, decode_video
from sglang_omni.engines.video_delivery import StreamingMp4
from sglang_omni.errors import BadRequest
from sglang_omni.media import RequestMediaDir, load_bytes
from sglang_omni.media.encode import encode_png
from sglang_omni.media.settings import policy_from_spec

DEFAULTS: dict[str, Any] = {"dtype": "auto", "defaults": {}, "denoiser": "auto"}
DENOISERS = ("auto", "fast", "stock")
WARM_UP = (("image", {"width": 256, "height": 256, "num_inference_steps": 2}),
           ("video", {"width": 256, "height": 256, "num_frames": 9, "num_inference_steps": 2}))


@dataclass
class Call:
    """One pipeline call, built and checked before it reaches the model thread."""

    modality: str
    kwargs: dict[str, Any]
    seed: int
    fps: int
    flow_shift: float | None = None
    media: dict[str, Any] = field(default_factory=dict)


class HFGenerator(ThreadedModelEngine):
    """``Cosmos3OmniPipeline`` from the checkpoint; one generation at a time."""

    def __init__(self, spec: EngineSpec) -> None:
        check_checkpoint_folder(spec)
        self.spec = spec
        self.options = engine_options(spec, DEFAULTS)
        defaults = self.options["defaults"]
        if not isinstance(defaults, dict):
            raise RuntimeError(f"stages.{spec.stage}.engine.defaults: expected a mapping of "
                               "generation options")
        try:
            self.defaults = check_generation_options(defaults)
        except BadRequest as exc:
            raise RuntimeError(f"stages.{spec.stage}.engine.defaults: {exc.message}") from None
        if self.options["denoiser"] not in DENOISERS:
            raise RuntimeError(f"stages.{spec.stage}.engine.denoiser: "
                               f"{self.options['denoiser']!r} is not one of "
                               f"{', '.join(DENOISERS)}")
        self.policy = policy_from_spec(spec.media_policy)
        self.encoding = video_encoding(spec.factory)
        # a job paused at a step boundary keeps its thread: the jobs that run meanwhile need
        # theirs (the stage's GPU turns let one compute at a time)
        self.thread = ModelThread(spec, workers=1 + MAX_PAUSED)

    def _load(self) -> None:
        importing = time.perf_counter()
        pipeline = pipeline_class(str(self.spec.model_path))

        started = time.perf_counter()
        self.device = torch_device(self.spec)
        dtype = torch_dtype(self.options["dtype"], self.device)
        guardrails = _guardrails_wanted()
        self.pipe = pipeline.from_pretrained(
            self.spec.model_path, dtype=dtype, enable_safety_checker=guardrails)
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        config = self.pipe.transformer.config
        self.has_sound = bool(getattr(config, "sound_gen", False)) and \
            getattr(self.pipe, "sound_tokenizer", None) is not None
        self.has_action = bool(getattr(config, "action_gen", False))
        self.base_flow_shift = getattr(self.pipe.scheduler.config, "flow_shift", None)
        denoiser = self.options["denoiser"]
        if denoiser == "auto":
            denoiser = "fast" if self.device.type == "cuda" else "stock"
        self.fast = denoiser == "fast"
        loaded = time.perf_counter() - started
        if self.device.type == "cuda":
            for modality, options in WARM_UP:
                self._denoise(Job("warmup", {}, [], emit=lambda _: None),
                              self._plan(modality, "warm up", options))
        self.parts = {"imports": started - importing, "weights": loaded,
                      "warm-up": time.perf_counter() - started - loaded}
        log.info("hf generator: %s loaded on %s (%s) in %.1f s, warmed up in %.1f s; imports "
                 "%.1f s; sound %s; guardrails %s; denoiser %s; pid %d", self.spec.model_path,
                 self.device, dtype, loaded, time.perf_counter() - started - loaded,
                 started - importing,
                 "yes" if self.has_sound else "no", "on" if guardrails else "off", denoiser,
                 os.getpid())

    async def run(self, job: Job) -> StageResult:
        payload = cast(GenerationPayload, job.payload)
        modality = payload.get("modality", "image")
        if wants_action(payload):  # the action route, or a forward-dynamics video
            return await run_action(self, job)
        if modality not in ("image", "video"):
            raise BadRequest(f"modality: expected image or video, got {modality!r}")
        options = {**self.defaults, **check_generation_options(payload.get("options"))}
        call = self._plan(modality, str(payload.get("prompt", "")), options)
        await self._read_conditioning(call, options)
        encoding = self.encoding.with_preset(options.get("x264_preset"))
        kw = call.kwargs
        # a silent video's MP4 is encoded as the VAE decodes its frames; a video with sound
        # once the pipeline is done (the MP4's audio track is opened with the sound's channels)
        mp4 = StreamingMp4(job, kw["width"], kw["height"], call.fps, encoding, prepare=to_uint8) \
            if modality == "video" and not kw.get("enable_sound") else None
        try:
            outcome = await self.thread.call(self._denoise, job, call,
                                             mp4.add if mp4 is not None else None,
                                             release=self.drop_vae_cache)
            if isinstance(outcome, str):
                log.warning("request %s: generation produced no media: %s", job.rid, outcome)
                return StageResult(MediaResult(media=[], reason=outcome))
            frames, sound = outcome
            if modality == "video":
                if mp4 is None:
                    mp4 = StreamingMp4(job, kw["width"], kw["height"], call.fps, encoding,
                                       sample_rate=self._sample_rate() if sound is not None
                                       else None,
                                       sound_channels=sound.shape[0] if sound is not None else 1,
                                       prepare=to_uint8)
                if frames is not None:  # a decode that was not handed over chunk by chunk
                    mp4.add(frames)
                mp4.finish(sound)
                data, mime = await mp4.result(), "video/mp4"
            else:
                with job.timed("encode"):
                    pixels = await _to_thread(to_uint8, frames)
                    data, mime = await _to_thread(encode_png, pixels[0]), "image/png"
        finally:
            if mp4 is not None:
                mp4.abandon()  # a no-op once the MP4 is done
        return StageResult(MediaResult(media=[{"kind": modality, "mime_type": mime, "frame": 0}],
                                       reason=None), [data])

    # --- request checks ------------------------------------------------------------------------
    def _plan(self, modality: str, prompt: str, options: dict[str, Any]) -> Call:
        where = "stage_params.generation"
        if options.get("action_mode") is not None:
            if not self.has_action:
                raise BadRequest(f"{where}.action_mode: this checkpoint has no action head")
            raise BadRequest(f"{where}.action_mode: the hf backend does not run action modes; "
                             "use the native backend")
        width = options.get("width", DEFAULT_SIZE)
        height = options.get("height", DEFAULT_SIZE)
        for key, value in (("width", width), ("height", height)):
            if value % HF_SIZE_MULTIPLE:
                raise BadRequest(f"{where}.{key}: the hf backend needs a multiple of "
                                 f"{HF_SIZE_MULTIPLE}, got {value}")
        fps = options.get("fps", DEFAULT_FPS)
        frames = options.get("num_frames", DEFAULT_VIDEO_FRAMES) if modality == "video" else 1
        sound = modality == "video" and bool(options.get("generate_sound")
                                             or options.get("sound_duration"))
        if sound and not self.has_sound:
            raise BadRequest(f"{where}.generate_sound: this checkpoint has no sound generator")
        kwargs: dict[str, Any] = {
            "prompt": prompt, "height": height, "width": width, "num_frames": frames,
            "fps": float(fps), "enable_sound": sound, "output_type": "np",
            "enable_safety_check": options.get("use_guardrails", True) is not False,
        }
        for key in ("num_inference_steps", "guidance_scale", "negative_prompt"):
            if key in options:
                kwargs[key] = options[key]
        return Call(modality, kwargs, int(options.get("seed", DEFAULT_SEED)), int(fps),
                    options.get("flow_shift"))

    async def _read_conditioning(self, call: Call, options: dict[str, Any]) -> None:
        """image_path conditions a video on its first frame, video_path on its first frames
        (read under the media policy); an image generation takes neither."""
        if call.modality != "video":
            return
        with RequestMediaDir() as workdir:
            for key in ("image_path", "video_path"):
                if options.get(key):
                    label = f"stage_params.generation.{key}"
                    data = await load_bytes(options[key], self.policy, workdir, label=label)
                    if key == "image_path":
                        call.kwargs["image"] = await _to_thread(decode_image, data, label)
                    else:
                        call.kwargs["video"] = await _to_thread(_video_frames, data, label)
        if "image" in call.kwargs and "video" in call.kwargs:
            raise BadRequest("stage_params.generation: image_path and video_path exclude each "
                             "other; set one")

    def drop_vae_cache(self) -> None:
        """Drop what the VAE keeps between the frames of one decode (its causal convolutions'
        feature cache): a decode that failed part way (out of memory, say) leaves it full until
        the next decode clears it; it is the failed request's, so it goes now."""
        clear = getattr(getattr(self.pipe, "vae", None), "clear_cache", None)
        if callable(clear):
            clear()

    # --- on the model thread -------------------------------------------------------------------
    def _denoise(self, job: Job, call: Call,
                 on_frames: Callable[[Any], None] | None = None) -> tuple[Any, Any] | str:
        """(frames, sound) as arrays, or the reason there is no media. With ``on_frames``,
        the fast loop hands the frames to it as the VAE decodes them (``denoise.decode_chunks``)
        and ``frames`` is None; other paths return them."""
        import torch

        if job.cancelled.is_set():
            raise JobCancelled()
        steps = int(call.kwargs.get("num_inference_steps", DEFAULT_STEPS))
        report_step = step_callback(job, steps, "generation")
        denoised = [0.0]  # when the last step ended: denoise before it, VAE decode after

        def on_step_end(pipe: Any, index: int, timestep: Any,
                        tensors: dict[str, Any]) -> dict[str, Any]:
            answer = report_step(pipe, index, timestep, tensors)
            if index + 1 == steps:
                if self.device.type == "cuda":  # the host runs ahead of the GPU's steps
                    torch.cuda.synchronize(self.device)
                denoised[0] = time.perf_counter()
            return answer

        scheduler = self.pipe.scheduler
        shifted = call.flow_shift is not None and call.flow_shift != self.base_flow_shift
        # the fast loop's own: the pipe keeps no state of the call between its steps
        own = type(scheduler).from_config(scheduler.config, flow_shift=call.flow_shift) \
            if shifted else copy.deepcopy(scheduler)
        fast = self.fast and denoise.unsupported(self.pipe, call.kwargs) is None
        if shifted and not fast:
            self.pipe.scheduler = own

        def pause(kept_bytes: int, step: int, of: int) -> None:
            if job.turn is None:
                return
            with self.thread.set_aside():  # the jobs that run meanwhile use the model
                job.step_boundary(kept_bytes, step, of)
            if job.cancelled.is_set():  # cancelled while paused: no further step
                log.info("request %s: generation cancelled while paused at step %d of %d",
                         job.rid, step, of)
                raise JobCancelled()

        kw = call.kwargs
        log.info("hf generator: request %s: %s %dx%d, %d frames, %d steps (%s): started",
                 job.rid, call.modality, kw["width"], kw["height"], kw["num_frames"], steps,
                 "fast" if fast else "stock")
        started = time.perf_counter()
        generator = torch.Generator("cpu").manual_seed(call.seed)
        try:
            if fast:
                output = denoise.generate(self.pipe, call.kwargs, generator, on_step_end,
                                          graphs=self.device.type == "cuda",
                                          on_frames=on_frames, scheduler=own, pause=pause)
            else:
                output = self.pipe(
                    **call.kwargs, generator=generator, callback_on_step_end=on_step_end,
                    callback_on_step_end_tensor_inputs=["latents"])
        except ValueError as exc:
            if "Guardrail" in str(exc):
                return f"the Cosmos guardrail refused the prompt ({exc})"
            raise BadRequest(f"stage_params.generation: {exc}") from None
        finally:
            self.pipe.scheduler = scheduler
        ended = time.perf_counter()
        if denoised[0]:
            job.spans["denoise"] = denoised[0] - started
            job.spans["vae_decode"] = ended - denoised[0]
        else:  # a pipeline that reported no last step: all of it is denoising
            job.spans["denoise"] = ended - started
        self._log_done(job, ended - started)
        if getattr(output, "streamed", 0):
            return None, None
        video = output.video
        if video is None or len(video) == 0:
            return "the pipeline returned no frames (the video guardrail may have blocked them)"
        sound = output.sound.float().cpu().numpy() if output.sound is not None else None
        return video, sound

    def _log_done(self, job: Job, seconds: float) -> None:
        """One line per generation (benchmarks/serve_gpu.py reads it): time, peak memory."""
        import torch

        peak = ""
        if self.device.type == "cuda":
            peak = f"; peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        log.info("hf generator: request %s: denoised and decoded in %.3f s%s", job.rid, seconds,
                 peak)

    def _sample_rate(self) -> int:
        return int(self.pipe.sound_tokenizer.config.sampling_rate)


def _guardrails_wanted() -> bool:
    """Whether the Cosmos guardrails run (``engines.guardrails``); logs why when they do not."""
    on, line = guardrails_state(os.environ)
    if not on:
        log.warning("%s", line)
    return on


async def _to_thread(fn: Any, *args: Any) -> Any:
    import anyio

    return await anyio.to_thread.run_sync(fn, *args)


def _video_frames(data: bytes, label: str) -> list[Any]:
    from PIL import Image

    return [Image.fromarray(f) for f in decode_video(data, label).frames]
