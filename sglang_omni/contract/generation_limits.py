"""The server's generation limits (``server.max_pixels``, ``max_frames``,
``max_inference_steps``, ``max_video_seconds``, ``max_aspect_ratio``,
``allowed_x264_presets``, and a frame rate of at most :data:`MAX_FPS`), and a model's own
(its largest side, the size multiple its engine needs), checked before any work.

One rule for every way a generation is asked for: ``stage_params.generation`` of an interleaved
request (before the Reasoner's first turn) and the direct image, video and action routes. A
size, length or step count the server would not survive (a 16384x16384 frame needs tens of GB)
or the engines refuse after spending a generation is a 400 that names the option, the limit and
the setting that raises it. A side left out counts as the engine default it gets (the model's
``Defaults``). Each model applies this rule through its ``contract.model.ServedModel``.

Only well-typed values are judged here (a positive ``int``); type errors are the callers' to
report (``generation_options.check_generation_options``, the routes' own checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.media.encode import check_x264_preset


@dataclass(frozen=True)
class Defaults:
    """What a generation gets for the options it leaves out."""

    width: int
    height: int
    frames: int
    fps: int


#: The highest frame rate a generated video may ask for (the MP4 encoder takes a rate up to
#: 2**31; players and the models' training, far less).
MAX_FPS = 240
#: The Reasoner's image processor refuses images whose aspect ratio is 200 or more, so an
#: interleaved request cannot feed such an image back to it.
REASONER_MAX_ASPECT = 200


def _int(options: Mapping[str, Any], key: str) -> int | None:
    value = options.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _ill_typed(options: Mapping[str, Any], *keys: str) -> bool:
    """Whether one of ``keys`` is given (not null) but is not a positive integer."""
    return any(options.get(k) is not None and _int(options, k) is None for k in keys)


def number(value: float, decimals: int = 3) -> str:
    """``value`` as a message shows it: an integer exactly (``2088960``, never ``2.08896e+06``),
    else rounded to ``decimals`` places, without an exponent."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def _over(where: str, what: str, limit: float, setting: str, fix: str) -> BadRequest:
    return BadRequest(f"{where}: {what}, over the server's limit of {number(limit)} "
                      f"(server.{setting}); {fix} or raise the limit with --server.{setting}")


def check_x264_preset_allowed(preset: Any, settings: ServerSettings, where: str = "") -> None:
    """BadRequest (400) naming ``{where}x264_preset`` and the allowed presets when ``preset`` (a
    string; anything else is the type check's) is not in ``server.allowed_x264_presets``: a
    slow preset costs many times the default's encode (docs/configuration.md). A name x264 does
    not have gets x264's list (``media.encode.check_x264_preset``)."""
    allowed = settings.allowed_x264_presets
    if not isinstance(preset, str) or preset in allowed:
        return
    check_x264_preset(preset, f"{where}x264_preset")
    choice = ", ".join(allowed) if allowed else "none: leave it out"
    raise BadRequest(f"{where}x264_preset: {preset!r} is not allowed on this server; allowed: "
                     f"{choice} (server.allowed_x264_presets)"[:400])


def check_generation_limits(options: Mapping[str, Any], settings: ServerSettings, *,
                            where: str = "", video: bool = True, defaults: Defaults,
                            multiple: int = 1, feeds_reasoner: bool = False,
                            max_side: int | None = None, model: str = "") -> None:
    """BadRequest (400) when the generation ``options`` ask for more than ``settings`` allow.

    ``where`` prefixes option names in messages (``stage_params.generation.``); ``video``: the
    options may make a video (frames, fps and seconds are checked); ``multiple``: the width and
    height multiple the engine needs; ``feeds_reasoner``: the result goes back to the Reasoner;
    ``max_side``: the largest width or height the model ``model`` makes (None: no limit of its
    own).
    """
    if not isinstance(options, Mapping):
        return
    check_x264_preset_allowed(options.get("x264_preset"), settings, where)
    given_w, given_h = _int(options, "width"), _int(options, "height")
    if _ill_typed(options, "width", "height"):
        return  # the type check names the side at fault; a default would mislead here
    width, height = given_w or defaults.width, given_h or defaults.height
    for key, value in (("width", given_w), ("height", given_h)):
        if value is not None and multiple > 1 and value % multiple:
            near = value // multiple * multiple or multiple
            raise BadRequest(f"{where}{key}: the generation engine needs a multiple of "
                             f"{multiple}, got {value}; use for example {near}")
    for key, value in (("width", width), ("height", height)):
        if max_side is not None and value > max_side:
            raise BadRequest(f"{where}{key}: {value}, over the {model or 'model'}'s largest "
                             f"side of {max_side}; ask for a smaller size"[:300])
    size = f"{where}width x {where}height"
    if width * height > settings.max_pixels:
        raise _over(size, f"{width}x{height} is {width * height} pixels per frame",
                    settings.max_pixels, "max_pixels", "ask for a smaller size")
    ratio = max(width / height, height / width)
    if ratio > settings.max_aspect_ratio:
        raise _over(size, f"{width}x{height} has an aspect ratio of {number(ratio)}",
                    settings.max_aspect_ratio, "max_aspect_ratio", "ask for a squarer size")
    if feeds_reasoner and ratio >= REASONER_MAX_ASPECT:
        raise BadRequest(f"{size}: {width}x{height} has an aspect ratio of {number(ratio)}; the "
                         f"Reasoner reads each generated image back and refuses aspect ratios "
                         f"of {REASONER_MAX_ASPECT} and more; ask for a squarer size")
    steps = _int(options, "num_inference_steps")
    if steps is not None and steps > settings.max_inference_steps:
        raise _over(f"{where}num_inference_steps", f"{steps} steps",
                    settings.max_inference_steps, "max_inference_steps", "ask for fewer steps")
    if not video:
        return
    if _ill_typed(options, "num_frames", "fps", "action_horizon"):
        return
    horizon = _int(options, "action_horizon")
    frames = _int(options, "num_frames") or (horizon + 1 if horizon else defaults.frames)
    if frames > settings.max_frames:
        raise _over(f"{where}num_frames", f"{frames} frames", settings.max_frames, "max_frames",
                    "ask for fewer frames")
    fps = _int(options, "fps") or defaults.fps
    if fps > MAX_FPS:
        raise BadRequest(f"{where}fps: {fps} frames per second; a video plays at most "
                         f"{MAX_FPS}, ask for fewer"[:300])
    seconds = frames / fps
    if seconds > settings.max_video_seconds:
        raise _over(f"{where}num_frames / {where}fps",
                    f"{frames} frames at {fps} fps are {number(seconds)} s of video",
                    settings.max_video_seconds, "max_video_seconds",
                    "ask for fewer frames or a higher fps")
