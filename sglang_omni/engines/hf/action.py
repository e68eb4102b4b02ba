"""Cosmos3 action modes on the hf backend: diffusers' ``CosmosActionCondition``.

* The action route (modality ``action``): ``policy`` (one observation image) and
  ``inverse_dynamics`` (an observation video) answer the native action envelope, with native's
  checks (:mod:`sglang_omni.contract.actions`) and defaults (horizon 16, 35 steps or the
  engine's ``defaults``, guidance 1.0, seed 42).
* ``forward_dynamics`` (a ``/v1/videos`` generation whose options carry ``action_mode:
  forward_dynamics`` and an ``action`` array ``[T, raw_action_dim]``): the video rolled out from
  the first frame (``image_path``, or the first frame of ``video_path``).

Differences from native, which diffusers' pipeline imposes: ``domain_name`` is required (the
action weights are chosen by name); the raw action width is the embodiment's
(``raw_action_dim`` may ask for fewer columns, never more); the conditioning canvas is the
resolution tier (256, 480, 704 or 720) closest to the requested height, and the frames follow
the input's aspect ratio. A checkpoint without action heads (``action_gen``) refuses with a 400
naming the native backend. Cancellation and progress work as for images and videos.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from sglang_omni.contract.actions import (
    action_envelope,
    action_fields,
    action_prompt,
    plan_action,
)
from sglang_omni.contract.generation_options import (
    ACTION_OPTION_DEFAULTS,
    check_generation_options,
)
from sglang_omni.contract.job import Job
from sglang_omni.contract.payloads import ActionResult, MediaResult
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.hf.common import JobCancelled, step_callback, to_uint8
from sglang_omni.engines.hf.conversation import decode_image, decode_video
from sglang_omni.engines.video_delivery import encode_progress
from sglang_omni.errors import BadRequest
from sglang_omni.media import RequestMediaDir, load_bytes
from sglang_omni.media.encode import VideoEncoding, encode_mp4

TIERS = (256, 480, 704, 720)
#: Native's action defaults, but the width (the frames follow the input's aspect ratio).
DEFAULTS = {k: v for k, v in ACTION_OPTION_DEFAULTS.items() if k != "width"}
IMAGE_KEYS = ("image", "image_path", "input_reference")
NO_HEADS = ("this checkpoint has no action heads (transformer action_gen), so the hf backend "
            "cannot run action modes; use a Cosmos3 checkpoint with action heads or the native "
            "backend")


def wants_action(payload: Mapping[str, Any]) -> bool:
    """Whether a generation payload is an action request or a forward-dynamics video."""
    options = payload.get("options") or {}
    return payload.get("modality") == "action" or payload.get("modality") == "video" and \
        isinstance(options, dict) and options.get("action_mode") is not None


def _tier(height: Any) -> int:
    wanted = height if isinstance(height, int) and not isinstance(height, bool) else 480
    return min(TIERS, key=lambda tier: abs(tier - wanted))


async def _image(engine: Any, value: Any, label: str, workdir: RequestMediaDir) -> Any:
    """One observation image: a reference, ``{"b64_json"}`` or ``{"values"}`` pixels."""
    import numpy as np
    from PIL import Image

    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return decode_image(await load_bytes(value, engine.policy, workdir, label=label), label)
    text = value.get("b64_json", value.get("base64")) if isinstance(value, dict) else None
    if isinstance(text, str):
        try:
            data = base64.b64decode(text.split(",", 1)[-1], validate=True)
        except ValueError:
            raise BadRequest(f"{label}.b64_json: not valid base64") from None
        return decode_image(data, label)
    if isinstance(value, dict) and value.get("values", value.get("data")) is not None:
        try:
            pixels = np.asarray(value.get("values", value.get("data")),
                                dtype=value.get("dtype") or np.uint8)
            if value.get("shape") is not None:
                pixels = pixels.reshape(value["shape"])
            return Image.fromarray(pixels.astype(np.uint8))
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"{label}: not an image array ({exc})") from None
    raise BadRequest(f"{label}: the hf backend reads one observation image (a reference, "
                     '{"b64_json": ...} or {"values": ...})')


async def _video(engine: Any, ref: Any, label: str, workdir: RequestMediaDir) -> list[Any]:
    from PIL import Image

    if not isinstance(ref, str):
        raise BadRequest(f"{label}: expected a video path or URL")
    data = await load_bytes(ref, engine.policy, workdir, label=label)
    return [Image.fromarray(frame) for frame in decode_video(data, label).frames]


def _run(engine: Any, job: Job, kwargs: dict[str, Any], seed: int) -> Any:
    """The pipeline call, on the model thread (cancellable between steps)."""
    import torch

    on_step_end = step_callback(job, int(kwargs["num_inference_steps"]), "action generation")
    if job.cancelled.is_set():
        raise JobCancelled()
    try:
        return engine.pipe(**kwargs, output_type="np", generator=torch.Generator(
            "cpu").manual_seed(seed), callback_on_step_end=on_step_end,
            callback_on_step_end_tensor_inputs=["latents"])
    except ValueError as exc:
        raise BadRequest(f"action: {exc}") from None


def _common(engine: Any, fields: dict[str, Any], prompt: str) -> tuple[dict[str, Any], int]:
    options = {**DEFAULTS, **{k: v for k, v in engine.defaults.items() if k in DEFAULTS},
               **{k: v for k, v in fields.items() if k in DEFAULTS and v is not None}}
    kwargs = {"prompt": prompt, "num_inference_steps": int(options["num_inference_steps"]),
              "guidance_scale": float(options["guidance_scale"]),
              "enable_safety_check": fields.get("use_guardrails", True) is not False}
    return kwargs, int(options["seed"])


async def run_action(engine: Any, job: Job) -> StageResult:
    """An action request or a forward-dynamics video on ``engine`` (an ``HFGenerator``)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    if not engine.has_action:
        raise BadRequest(NO_HEADS)
    payload = job.payload
    video_call = payload.get("modality") != "action"
    fields = check_generation_options(payload.get("options")) if video_call else \
        action_fields(dict(payload.get("request") or {}))
    prompt = str(payload.get("prompt", "")) if video_call else \
        action_prompt(fields)
    mode = str(fields.get("action_mode", "policy")).strip().lower()
    if video_call and mode != "forward_dynamics":
        raise BadRequest(f"action_mode: {mode!r} returns actions; use /v1/actions/generations")
    if video_call:
        actions = fields.get("action")
        if not isinstance(actions, list) or not actions:
            raise BadRequest("action: forward_dynamics needs the actions to roll out, a "
                             "[T, raw_action_dim] array")
        horizon = int(fields.get("action_horizon") or len(actions))
        if horizon % 4:
            raise BadRequest("action_horizon: Cosmos3 needs a multiple of 4 (frames = horizon "
                             "+ 1 for the temporal VAE)")
        domain_name, raw_dim = fields.get("domain_name"), None
    else:
        plan = plan_action(fields)
        mode, horizon, domain_name, raw_dim = plan.mode, plan.horizon, plan.domain_name, \
            plan.raw_action_dim
    if not domain_name:
        raise BadRequest("domain_name: the hf backend chooses the action weights by embodiment "
                         "name (e.g. droid_lerobot); give domain_name")
    kwargs, seed = _common(engine, fields, prompt)
    condition: dict[str, Any] = {"mode": mode, "chunk_size": horizon,
                                 "domain_name": str(domain_name),
                                 "resolution_tier": _tier(fields.get("height")),
                                 "view_point": str(fields.get("action_view_point") or
                                                   "ego_view")}
    with RequestMediaDir() as workdir:
        if mode == "inverse_dynamics":
            video = fields.get("video_path") or fields.get("video")
            if video is None:
                raise BadRequest("Cosmos3 inverse_dynamics input requires an observation video")
            condition["video"] = await _video(engine, video, "video", workdir)
        elif video_call and fields.get("video_path") and not fields.get("image_path"):
            frames = await _video(engine, fields["video_path"], "video_path", workdir)
            condition["image"] = frames[0]
        else:
            key = next((k for k in IMAGE_KEYS if fields.get(k) is not None), None)
            images = fields.get("images")
            if key is None and isinstance(images, dict) and len(images) == 1:
                key, value = "images", next(iter(images.values()))
            elif key is None:
                raise BadRequest("Cosmos3 policy input requires an observation image")
            else:
                value = fields[key]
            condition["image"] = await _image(engine, value, key, workdir)
    if video_call:
        import torch

        condition["raw_actions"] = torch.tensor(fields["action"], dtype=torch.float32)
    try:
        kwargs["action"] = CosmosActionCondition(**condition)
    except ValueError as exc:
        raise BadRequest(f"action: {exc}") from None
    output = await engine.thread.call(_run, engine, job, kwargs, seed,
                                      release=engine.drop_vae_cache)
    if video_call:
        return await _video_result(job, output, int(fields.get("fps") or 24),
                                   engine.encoding.with_preset(fields.get("x264_preset")))
    values = output.action[0].float()
    width = values.shape[-1]
    if raw_dim is not None and raw_dim > width:
        raise BadRequest(f"raw_action_dim: {domain_name} actions have {width} values; ask for "
                         f"at most {width}")
    dim = raw_dim or width
    domain_id = fields.get("domain_id")
    if domain_id is None:
        from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as module

        domain_id = getattr(module, "_EMBODIMENT_TO_DOMAIN_ID", {}).get(domain_name, 0)
    return StageResult(ActionResult(action=action_envelope(
        job.rid, values[:, :dim].tolist(), mode=mode, domain_id=int(domain_id),
        raw_action_dim=dim, steps=int(kwargs["num_inference_steps"]))))


async def _video_result(job: Job, output: Any, fps: int,
                        encoding: VideoEncoding) -> StageResult:
    import anyio

    video = output.video
    if video is None or len(video) == 0:
        return StageResult(MediaResult(media=[], reason="the pipeline returned no frames"))
    progress = encode_progress(job)
    with job.timed("encode"):
        data = await anyio.to_thread.run_sync(lambda: encode_mp4(
            list(to_uint8(video)), fps, encoding=encoding, progress=progress))
    return StageResult(MediaResult(media=[{"kind": "video", "mime_type": "video/mp4",
                                           "frame": 0}], reason=None), [data])
