"""The fields of the direct image and video routes: which a route takes, and the generation
options they become (``extra_params``/``extra_body`` promoted, ``size`` split, ``n`` checked).

One home for the wire rules the image, edit, video and realtime video routes share.
"""

from __future__ import annotations

from typing import Any

from sglang_omni.config.server import ServerSettings
from sglang_omni.contract.generation_options import check_option_value
from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.request_body import parse_json

DEFAULT_SECONDS = 4  # the native video route's default length
VIDEO_EXTENSIONS = (".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".webm")

IMAGE_FIELDS = ("prompt", "n", "size", "response_format", "output_format", "model", "user")
EDIT_FIELDS = (*IMAGE_FIELDS, "image", "url", "mask", "num_frames")
VIDEO_FIELDS = ("prompt", "n", "num_outputs_per_prompt", "seconds", "size", "model", "user",
                "input_reference", "reference_url", "video_url", "video_reference")
STRING_FIELDS = ("model", "user", "size", "response_format", "output_format")
NOT_HERE = ("output_path", "output_file_name", "save_output", "return_frames",
            "return_file_paths_only")
RESPONSE_FORMATS = ("b64_json", "url")


def flatten(body: Any, settings: ServerSettings) -> dict[str, Any]:
    """The fields of a validated body, with ``extra_params``/``extra_body`` fields and
    ``guardrails`` promoted, as native does. One given as a JSON string is parsed with the
    body's checks under the server's ``settings`` (depth, values)."""
    out = body.model_dump(exclude_unset=True)
    for container in ("extra_params", "extra_body"):
        extra = out.pop(container, None)
        if isinstance(extra, str):
            try:  # the same checks as the body itself
                extra = parse_json(extra.encode(), settings.max_json_depth,
                                   settings.max_json_values)
            except BadRequest as exc:
                raise BadRequest(f"{container}: expected a JSON object; {exc.message}") from None
        if extra is None:
            continue
        if not isinstance(extra, dict):
            raise BadRequest(f"{container}: expected a JSON object")
        for key, value in extra.items():
            out.setdefault(key, value)
    if "guardrails" in out:
        out.setdefault("use_guardrails", out.pop("guardrails"))
    return out


def split(body: dict[str, Any], fields: tuple[str, ...], options: tuple[str, ...],
          route: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The route fields and the generation options of a body; 400 naming a wrong field."""
    route_fields: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    for key, value in body.items():
        if key in NOT_HERE:
            raise BadRequest(f"{key}: SGLang Omni returns generated media itself and manages "
                             "the native output folders; remove it")
        if key in fields:
            route_fields[key] = value
        elif key in options:
            if value is not None:
                check_option_value(key, key, value)
                opts[key] = value
        else:
            raise BadRequest(f"{key}: not a field of {route} on this server; accepted: "
                             f"{', '.join(sorted((*fields, *options)))}")
    prompt = route_fields.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt: required, a string")
    for key in STRING_FIELDS:
        if route_fields.get(key) is not None and not isinstance(route_fields[key], str):
            raise BadRequest(f"{key}: expected a string, got {type(route_fields[key]).__name__}")
    for key in ("n", "num_outputs_per_prompt"):
        if route_fields.get(key) not in (None, 1):
            raise BadRequest(f"{key}: each generation returns exactly one media item; leave it "
                             "at 1")
    size = route_fields.get("size")
    if size:
        width, sep, height = str(size).lower().partition("x")
        if not sep or not width.isdigit() or not height.isdigit() or not int(width) \
                or not int(height):
            raise BadRequest(f"size: expected WIDTHxHEIGHT, got {size!r}")
        opts.setdefault("width", int(width))
        opts.setdefault("height", int(height))
    return route_fields, opts


def check_image_format(fields: dict[str, Any]) -> str:
    """The response format of an image route (``b64_json`` unless ``url`` is asked for)."""
    fmt = fields.get("response_format")
    if fmt not in (None, *RESPONSE_FORMATS):
        raise BadRequest(f"response_format: expected b64_json or url, got {fmt!r}")
    if fields.get("output_format") not in (None, "png"):
        raise BadRequest("output_format: native Cosmos3 writes PNG images; use png")
    return fmt or "b64_json"


def is_video_source(ref: Any) -> bool:
    """Whether a reference names a video (a ``data:video/`` URL or a video file extension),
    as native decides between ``image_path`` and ``video_path``."""
    if not isinstance(ref, str):
        return False
    if ref.startswith("data:"):
        return ref[5:].startswith("video/")
    return ref.split("?", 1)[0].split("#", 1)[0].lower().endswith(VIDEO_EXTENSIONS)
