"""Request bodies of the direct generation routes (``Cosmos3PipelineConfig``).

Generation options are the native image and video routes' (the table in
:mod:`sglang_omni.contract.generation_options`, checked by its ``check_option_value``); they may
also come inside ``extra_params``/``extra_body`` (an object or its JSON text), as native
accepts. The action route's body is the native action route's; its rules are the served
model's (``contract.model.ServedModel.check_action_request``) and run in the route. The image
edit route and the video and action routes also read forms (``serve.body_formats``): an upload
arrives here as a ``data:`` URL in its field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, create_model

from sglang_omni.contract.generation_options import OPTIONS, POSITIVE, check_option_value
from sglang_omni.media.encode import X264_PRESETS
from sglang_omni.serve.schemas.fields import STRING, Checked, WireModel, checked, documented

_JSON_TYPE = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array"}

IMAGE_OPTIONS = ("width", "height", "seed", "num_inference_steps", "guidance_scale",
                 "negative_prompt", "flow_shift", "max_sequence_length", "use_guardrails")
VIDEO_OPTIONS = (*IMAGE_OPTIONS, "num_frames", "fps", "image_path", "video_path",
                 "generate_sound", "sound_duration", "action_mode", "action", "domain_name",
                 "domain_id", "raw_action_dim", "action_horizon", "x264_preset")
EXTRA = documented({"oneOf": [{"type": "object"}, {"type": "string"}]},
                   "more generation options, as an object or its JSON text (native style)")


def _option(key: str) -> Checked:
    types = OPTIONS[key]
    kinds = [_JSON_TYPE[t] for t in types if t in _JSON_TYPE]
    schema: dict[str, Any] = {"type": "number" if kinds == ["integer", "number"] else kinds[0]}
    if key in POSITIVE:
        schema["exclusiveMinimum"] = 0
    if key == "x264_preset":
        schema["enum"] = list(X264_PRESETS)
    return checked(lambda value: check_option_value(key, key, value), schema, key)


def _options(keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: (Annotated[Any, _option(key)], None) for key in keys}


GUARDRAILS = documented({"type": "boolean"}, "the same as use_guardrails")
ONE = documented({"type": "integer", "enum": [1]}, "one media item per request")
RESPONSE_FORMAT = documented({"enum": ["b64_json", "url"]}, "b64_json (the default), or url: "
                             "GET /v1/images/{id}/content serves the image for a while")
OUTPUT_FORMAT = documented({"enum": ["png"]})
SECONDS = documented({"type": "integer", "exclusiveMinimum": 0},
                     "length when num_frames is unset (frames = fps x seconds)")
REFERENCE = documented({"type": "string"}, "an image or video to condition on (a path or URL "
                       "under the media policy, or a data URL)")
VIDEO_REFERENCE = documented({"type": "string"}, "a video to condition on")
UPLOADED_VIDEO = documented({"type": "string"}, "a video to condition on (a form upload; in JSON "
                            "a path or URL under the media policy, or a data URL)")
STRINGS = documented({"type": "array", "items": {"type": "string"}})
PLAIN_STRING = documented({"type": "string"})
OBJECT = {"type": "object"}
ACTION_INPUT = documented(OBJECT, 'task, prompt and observation media (image/video as a path, '
                          'URL, {"b64_json"} or {"values"})')
ACTION_PARAMETERS = documented(OBJECT, "action_mode, action_horizon, raw_action_dim, domain "
                               "and sampling options")
ACTION_RUNTIME = documented(OBJECT)


class _DirectFields(WireModel):
    prompt: Annotated[Any, STRING] = Field(..., description="what to generate")
    model: Annotated[Any, STRING] = None
    user: Annotated[Any, STRING] = None
    size: Annotated[Any, STRING] = Field(None, description="WIDTHxHEIGHT, e.g. 1280x720")
    extra_params: Annotated[Any, EXTRA] = None
    extra_body: Annotated[Any, EXTRA] = None
    guardrails: Annotated[Any, GUARDRAILS] = None


_ImageBase = create_model("_ImageBase", __base__=_DirectFields, **_options(IMAGE_OPTIONS))
_VideoBase = create_model("_VideoBase", __base__=_DirectFields, **_options(VIDEO_OPTIONS))


class ImageGenerationRequest(_ImageBase):  # type: ignore[misc,valid-type]
    """``POST /v1/images/generations``: one image per request."""

    n: Annotated[Any, ONE] = None
    response_format: Annotated[Any, RESPONSE_FORMAT] = None
    output_format: Annotated[Any, OUTPUT_FORMAT] = None


class VideoGenerationRequest(_VideoBase):  # type: ignore[misc,valid-type]
    """``POST /v1/videos``: creates a video job (poll ``GET /v1/videos/{id}``)."""

    n: Annotated[Any, ONE] = None
    num_outputs_per_prompt: Annotated[Any, ONE] = None
    seconds: Annotated[Any, SECONDS] = None
    input_reference: Annotated[Any, REFERENCE] = None
    reference_url: Annotated[Any, REFERENCE] = None
    video_url: Annotated[Any, VIDEO_REFERENCE] = None
    video_reference: Annotated[Any, UPLOADED_VIDEO] = None


class ImageEditRequest(_ImageBase):  # type: ignore[misc,valid-type]
    """``POST /v1/images/edits`` (a form): ``image`` (or ``image[]``) uploads and/or ``url``
    (or ``url[]``) references, and the image route's fields. Cosmos3 conditions on one image."""

    image: Annotated[Any, STRINGS] = None
    url: Annotated[Any, STRINGS] = None
    mask: Annotated[Any, PLAIN_STRING] = None
    n: Annotated[Any, ONE] = None
    num_frames: Annotated[Any, ONE] = None
    response_format: Annotated[Any, RESPONSE_FORMAT] = None
    output_format: Annotated[Any, OUTPUT_FORMAT] = None


class ActionGenerationRequest(WireModel):
    """``POST /v1/actions/generations``: the native Cosmos3 action route's body (policy,
    inverse and forward dynamics). Fields may sit at the top level, in ``input`` (and
    ``input.observation``) or in ``parameters``; later ones win, as native reads them."""

    model: Annotated[Any, PLAIN_STRING] = None
    request_id: Annotated[Any, PLAIN_STRING] = None
    prompt: Annotated[Any, PLAIN_STRING] = None
    task: Annotated[Any, PLAIN_STRING] = None
    input: Annotated[Any, ACTION_INPUT] = None
    parameters: Annotated[Any, ACTION_PARAMETERS] = None
    runtime: Annotated[Any, ACTION_RUNTIME] = None
