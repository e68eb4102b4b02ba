"""The native Cosmos3 action route's request body, checked before any work.

The native route reads its fields from the body itself (without ``input``), or from ``input``
and ``input.observation``, then ``parameters`` (later ones win), and converts numbers with
``int()``/``float()``: a wrong type there is an engine exception (a 500). Here every known field
of every container is type-checked (400 naming it), and every media value must be a path or URL
string that passes the media policy, an inline ``{"b64_json": ...}`` image or a pixel array
(``{"values": ...}``); ``{"url": "..."}`` is read as its URL.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from sglang_omni.errors import BadRequest

INT, NUM, STR, BOOL = (int,), (int, float), (str,), (bool,)
#: Field -> (accepted types, may be null, must be positive).
FIELDS: dict[str, tuple[tuple[type, ...], bool, bool]] = {
    "width": (INT, False, True), "height": (INT, False, True), "fps": (INT, False, True),
    "num_inference_steps": (INT, False, True), "seed": (INT, False, False),
    "guidance_scale": (NUM, False, False), "action_horizon": (INT, True, True),
    "num_frames": (INT, True, True), "domain_id": (INT, True, False),
    "raw_action_dim": (INT, True, True), "max_sequence_length": (INT, True, True),
    "action_fps": (NUM, True, True), "flow_shift": (NUM, True, False),
    "sound_duration": (NUM, True, False), "action_mode": (STR, False, False),
    "domain_name": (STR, True, False), "action_view_point": (STR, False, False),
    "action_normalization": (STR, False, False), "condition_video_keep": (STR, False, False),
    "task": (STR, True, False), "prompt": (STR, True, False), "use_guardrails": (BOOL, True, False),
    "generate_sound": ((bool, str), True, False), "enable_sound": ((bool, str), True, False),
}
CONTAINERS = ("input", "parameters", "runtime")
#: ``runtime.response_format``: native's whole envelope, or the model's raw output.
RESPONSE_FORMATS = ("envelope", "raw")
IMAGE_KEYS = ("image", "image_path", "input_reference")
VIDEO_KEYS = ("video", "video_path")


def _type_name(types: tuple[type, ...]) -> str:
    if types == NUM:
        return "a number"
    return " or ".join({int: "an integer", str: "a string", bool: "a boolean"}[t] for t in types)


def _check_field(label: str, value: Any, spec: tuple[tuple[type, ...], bool, bool]) -> None:
    types, nullable, positive = spec
    if value is None:
        if not nullable:
            raise BadRequest(f"{label}: expected {_type_name(types)}, got null; leave it out "
                             "for the default")
        return
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise BadRequest(f"{label}: expected {_type_name(types)}, got {value!r}"[:300])
    if positive and isinstance(value, int | float) and value <= 0:
        raise BadRequest(f"{label}: expected a positive value, got {value!r}")


def _containers(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(label prefix, mapping)`` of every place the native route reads fields from."""
    yield "", body
    for key in CONTAINERS:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise BadRequest(f"{key}: expected an object, got {type(value).__name__}")
        yield f"{key}.", value
    given = body.get("input")
    if isinstance(given, dict) and given.get("observation") is not None:
        if not isinstance(given["observation"], dict):
            raise BadRequest("input.observation: expected an object")
        yield "input.observation.", given["observation"]


def _media(label: str, value: Any, video: bool, check: Any) -> Any:
    """The media value to pass on (``{"url": x}`` becomes ``x``); BadRequest otherwise."""
    if isinstance(value, dict) and set(value) == {"url"}:
        value, label = value["url"], f"{label}.url"
    if isinstance(value, str):
        check(value, label=label)
        return value
    kind = "video" if video else "image"
    if not video and isinstance(value, dict):
        inline = value.get("b64_json", value.get("base64"))
        if inline is not None:
            if not isinstance(inline, str):
                raise BadRequest(f"{label}.b64_json: expected a base64 string")
            return value
        if value.get("values", value.get("data")) is not None:
            return value  # pixels inline, as the native route reads them
    shapes = "a path or URL string" if video else \
        'a path or URL string, {"b64_json": ...} or {"values": [...]}'
    raise BadRequest(f"{label}: expected one {kind} as {shapes}, got "
                     f"{type(value).__name__}")


def check_action_request(body: dict[str, Any], check_media: Any) -> dict[str, Any]:
    """A checked copy of an action-route body; ``check_media(ref, label=...)`` is the media
    policy's check of every path or URL. BadRequest (400) names the field at fault."""
    body = copy.deepcopy(body)
    response_format(body)
    for prefix, container in list(_containers(body)):
        for key, spec in FIELDS.items():
            if key in container:
                _check_field(f"{prefix}{key}", container[key], spec)
        for key in (*IMAGE_KEYS, *VIDEO_KEYS):
            if container.get(key) is not None:
                container[key] = _media(f"{prefix}{key}", container[key], key in VIDEO_KEYS,
                                        check_media)
        images = container.get("images")
        if images is None:
            continue
        if not isinstance(images, dict):
            raise BadRequest(f"{prefix}images: expected an object naming each camera's image "
                             f'({{"wrist": ...}}), got {type(images).__name__}')
        for name, value in images.items():
            images[name] = _media(f"{prefix}images.{name}", value, False, check_media)
    return body


def response_format(body: dict[str, Any]) -> str:
    """``runtime.response_format`` of a body (``envelope`` by default); 400 for another."""
    runtime = body.get("runtime")
    value = runtime.get("response_format") if isinstance(runtime, dict) else None
    chosen = "envelope" if value is None else str(value).lower()
    if chosen not in RESPONSE_FORMATS:
        raise BadRequest(f"runtime.response_format: must be 'envelope' or 'raw', got {value!r}")
    return chosen
