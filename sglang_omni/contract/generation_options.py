"""``stage_params.generation``: the options the native Cosmos3 image and video routes accept.

They apply to every generation of a request and are checked before the first turn.
"""

from __future__ import annotations

from typing import Any

from sglang_omni.contract.actions import MODEL_ACTION_DIM
from sglang_omni.errors import BadRequest
from sglang_omni.media.encode import check_x264_preset
from sglang_omni.media.refs import GENERATION_MEDIA_KEYS

INT, NUM, STR, BOOL, LIST = (int,), (int, float), (str,), (bool,), (list,)
OPTIONS: dict[str, tuple[type, ...]] = {
    "width": INT, "height": INT, "num_frames": INT, "fps": INT, "seed": INT,
    "num_inference_steps": INT, "guidance_scale": NUM, "negative_prompt": STR,
    "image_path": STR, "video_path": STR, "flow_shift": NUM, "max_sequence_length": INT,
    "generate_sound": BOOL, "sound_duration": NUM, "use_guardrails": BOOL,
    "action_mode": STR, "action": LIST, "domain_name": STR, "domain_id": INT,
    "raw_action_dim": INT, "action_horizon": INT, "x264_preset": STR,
}
POSITIVE = ("width", "height", "num_frames", "fps", "num_inference_steps")
MEDIA_OPTIONS = GENERATION_MEDIA_KEYS  # the options that name media (read under the policy)
NOT_HERE = {
    "output_path": "Omni returns generated media inline and manages native output folders",
    "output_file_name": "Omni returns generated media inline and manages native output folders",
    "save_output": "Omni returns generated media inline",
    "return_frames": "Omni returns generated media inline",
    "return_file_paths_only": "Omni returns generated media inline",
    "num_outputs_per_prompt": "each generation returns exactly one media item",
    "prompt": "the Reasoner writes each generation prompt",
    "n": "each generation returns exactly one media item",
}
ACTION_MODES = ("forward_dynamics",)
#: Generation defaults where a request leaves them unset (native ``Cosmos3SamplingParams.fps``
#: in SGLang 0.5.23 is 24; interleaved videos default to 33 frames, as the spec says).
DEFAULT_VIDEO_FRAMES = 33
DEFAULT_FPS = 24
#: The hf and scripted engines' width and height, and seed, where a request leaves them unset
#: (native SGLang has its own: ``models.cosmos3.generation_limits.NATIVE_DEFAULTS``).
DEFAULT_SIZE = 640
DEFAULT_SEED = 0
#: The hf engines' denoising steps where a request (and the engine's ``defaults``) leave them
#: unset: native Cosmos3's 35, for images, videos and actions alike.
DEFAULT_STEPS = 35
#: Width and height multiple of the hf backend (the diffusers Cosmos3 pipeline's VAE spatial
#: scale factor): the engine refuses others, the limit check refuses them before any work.
HF_SIZE_MULTIPLE = 16
#: Native's action defaults (``build_cosmos3_action_sampling_params``; the realtime video
#: route's seed, guidance and size too; the horizon is ``actions.DEFAULT_HORIZON``): the one
#: home, read by the hf action engine, the limit check, the action metadata and the realtime
#: route.
ACTION_OPTION_DEFAULTS: dict[str, Any] = {
    "num_inference_steps": DEFAULT_STEPS, "guidance_scale": 1.0, "seed": 42, "width": 832,
    "height": 480, "fps": 5}


def check_option_value(where: str, key: str, value: Any) -> None:
    """BadRequest at ``where`` unless ``value`` (not None) has the type option ``key`` takes,
    and is positive where it must be."""
    types = OPTIONS[key]
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        names = "/".join("number" if t is float else t.__name__ for t in types)
        raise BadRequest(f"{where}: expected {names}, got {value!r}")
    if key in POSITIVE and isinstance(value, int) and value <= 0:
        raise BadRequest(f"{where}: expected a positive integer, got {value!r}")
    if key == "x264_preset":
        check_x264_preset(value, where)
    if key == "raw_action_dim" and isinstance(value, int) and not 0 < value <= MODEL_ACTION_DIM:
        raise BadRequest(f"{where}: expected 1 to {MODEL_ACTION_DIM} (the model's action "
                         f"width), got {value!r}"[:300])


def check_generation_options(options: Any) -> dict[str, Any]:
    """Return a copy of valid options; BadRequest naming the field otherwise."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise BadRequest("stage_params.generation: expected an object of generation options")
    out: dict[str, Any] = {}
    for key, value in options.items():
        where = f"stage_params.generation.{key}"
        if key in NOT_HERE:
            raise BadRequest(f"{where}: not accepted by the interleaved pipeline: "
                             f"{NOT_HERE[key]}; remove it")
        if key not in OPTIONS:
            raise BadRequest(f"{where}: not an option of the native image and video routes; "
                             f"accepted: {', '.join(sorted(OPTIONS))}")
        if value is None:
            continue
        check_option_value(where, key, value)
        if key == "action_mode" and value not in ACTION_MODES:
            raise BadRequest(f"{where}: {value!r} returns actions, not media; the interleaved "
                             f"pipeline takes {', '.join(ACTION_MODES)} (use the direct "
                             "generation action route for the others)")
        out[key] = value
    return out


def modalities_for(options: dict[str, Any]) -> tuple[str, ...]:
    """The media the Reasoner may request under these options."""
    if options.get("action_mode") == "forward_dynamics":
        return ("video",)
    return ("image", "video")


def denoising_steps(options: Any) -> int | None:
    """The ``num_inference_steps`` that generation ``options`` name: a positive int, else None
    (the engine's default)."""
    return positive_int(options.get("num_inference_steps")) if isinstance(options, dict) \
        else None


def positive_int(value: Any) -> int | None:
    """``value`` if it is a positive int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
