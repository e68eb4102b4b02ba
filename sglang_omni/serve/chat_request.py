"""Parse and check an OpenAI chat request body into a ``ChatRequest``.

Rules (native chat stage spec): messages carry text, image_url, video_url and audio_url parts;
top-level ``images``/``videos`` are added to the last user message; top-level ``audios`` and video
processing options are refused; other native fields go under ``stage_params.<stage>``; tools,
``n`` above 1 and log probabilities on a stream are refused; number fields take numbers, never
booleans. All refusals are 400.
"""

from __future__ import annotations

import copy
from typing import Any

from sglang_omni.engines.base import OMNI_OWNED_FIELDS
from sglang_omni.errors import BadRequest
from sglang_omni.pipeline.chat_request import (
    LENGTH_STOP_FIELDS,
    OUTPUT_FIELDS,
    SAMPLING_FIELDS,
    ChatRequest,
)

#: Top-level fields that go to the Reasoner with the request's sampling.
SAMPLING_LIKE_FIELDS = SAMPLING_FIELDS + LENGTH_STOP_FIELDS + OUTPUT_FIELDS
VIDEO_OPTIONS = ("video_fps", "video_max_frames", "video_min_frames", "max_frames", "fps",
                 "video_max_pixels", "video_min_pixels", "do_sample_frames")
ENVELOPE_FIELDS = ("model", "messages", "stream", "stream_options", "rid", "images", "videos",
                   "stage_params", "stage_sampling", "user", "n", "tools", "tool_choice",
                   "logprobs", "top_logprobs", "response_format", "return_logprob")
#: Fields that take a number (int or float) and those that take a whole number; null is unset.
NUMBER_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
INTEGER_FIELDS = ("top_k", "seed", "max_tokens", "max_completion_tokens", "min_tokens", "n",
                  "top_logprobs")
ROLES = ("system", "user", "assistant", "developer")
PART_TYPES = ("text", "image_url", "video_url", "audio_url")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of chat messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: expected an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
        if "tool_calls" in message or role == "tool":
            raise BadRequest(f"{where}: tool messages are not served here; run sglang serve "
                             "on the same checkpoint for native tool calls")
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                _check_part(f"{where}.content[{j}]", part)
        elif not isinstance(content, str):
            raise BadRequest(f"{where}.content: expected a string or a list of content parts")
        out.append(copy.deepcopy(message))
    return out


def _check_part(where: str, part: Any) -> None:
    if not isinstance(part, dict):
        raise BadRequest(f"{where}: expected a content part object")
    kind = part.get("type")
    if kind not in PART_TYPES:
        raise BadRequest(f"{where}.type: expected one of {', '.join(PART_TYPES)}, got {kind!r}")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}.text: expected a string")
        return
    ref = part.get(kind)
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where}.{kind}: expected {{\"url\": \"...\"}} with a non-empty url")


def _media_part(kind: str, ref: Any, where: str) -> dict[str, Any]:
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where}: expected a url string or {{\"url\": \"...\"}}")
    key = f"{kind}_url"
    return {"type": key, key: {"url": url}}


def _dict_field(body: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise BadRequest(f"{key}: expected an object of stage name to an object of fields, "
                         f"for example {{\"reasoner\": {{\"temperature\": 0.2}}}}")
    return copy.deepcopy(value)


def check_number_fields(where: str, fields: dict[str, Any]) -> None:
    """400 for a number field holding a non-number; booleans are not numbers here."""
    for key in NUMBER_FIELDS + INTEGER_FIELDS:
        value = fields.get(key)
        if value is None:
            continue
        whole = key in INTEGER_FIELDS
        kinds = int if whole else int | float
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise BadRequest(f"{where}{key}: expected {'an integer' if whole else 'a number'}, "
                             f"got {value!r}")


def refuse_single_completion_fields(where: str, fields: dict[str, Any], stream: bool) -> None:
    """Tools, several choices and streamed log probabilities need ``sglang serve``."""
    hint = "; run sglang serve on the same checkpoint for that"
    if fields.get("tools"):
        raise BadRequest(f"{where}tools: native tool calls are not served by this stage{hint}")
    if fields.get("tool_choice") not in (None, "none"):
        raise BadRequest(f"{where}tool_choice: native tool calls are not served by this "
                         f"stage{hint}")
    n = fields.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"{where}n: the stage returns one completion per request; set n to 1"
                         f"{hint}")
    if stream and (fields.get("logprobs") or fields.get("top_logprobs")):
        raise BadRequest(f"{where}logprobs: log probabilities are not streamed by this stage; "
                         f"use stream false{hint}")


def parse_chat_request(body: Any, *, reasoner_stage: str = "reasoner",
                       known_stages: tuple[str, ...] = ("reasoner",)) -> ChatRequest:
    """Check ``body`` and build a ChatRequest; raises BadRequest naming the field and fix."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for key in ("audios",):
        if key in body:
            raise BadRequest("audios: top-level audio lists are not read by native SGLang; put "
                             "each audio in the messages as an audio_url content part")
    for key in VIDEO_OPTIONS:
        if key in body:
            raise BadRequest(f"{key}: video processing options are not accepted; native SGLang "
                             "reads video only from video_url content parts")
    unknown = [k for k in body if k not in ENVELOPE_FIELDS + SAMPLING_LIKE_FIELDS]
    if unknown:
        raise BadRequest(f"{unknown[0]}: not a field of this route; put other native chat "
                         f"fields under stage_params.{reasoner_stage}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: expected true or false")
    messages = _check_messages(body.get("messages"))
    for kind in ("image", "video"):
        items = body.get(f"{kind}s")
        if items is None:
            continue
        if not isinstance(items, list):
            raise BadRequest(f"{kind}s: expected a list of urls")
        users = [m for m in messages if m["role"] == "user"]
        if not users:
            raise BadRequest(f"{kind}s: there is no user message to add the {kind}s to")
        last = users[-1]
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"].extend(_media_part(kind, ref, f"{kind}s[{i}]")
                               for i, ref in enumerate(items))
    stage_params = _dict_field(body, "stage_params")
    stage_sampling = _dict_field(body, "stage_sampling")
    for key, table in (("stage_params", stage_params), ("stage_sampling", stage_sampling)):
        for stage in table:
            if stage not in known_stages:
                raise BadRequest(f"{key}.{stage}: no such stage; this pipeline has "
                                 f"{', '.join(known_stages)}")
    check_number_fields("", body)
    refuse_single_completion_fields("", body, stream)
    native_fields = stage_params.get(reasoner_stage, {})
    refuse_single_completion_fields(f"stage_params.{reasoner_stage}.", native_fields, stream)
    for key in native_fields:
        where = f"stage_params.{reasoner_stage}.{key}"
        if key in OMNI_OWNED_FIELDS:
            raise BadRequest(f"{where}: Omni sets it from the request; use the top-level "
                             "field and remove it here")
        if key in VIDEO_OPTIONS or key in ("audios", "images", "videos"):
            raise BadRequest(f"{where}: native SGLang reads media only from content parts; "
                             "put the media in the messages and remove it here")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options: expected an object")
    sampling = {k: body[k] for k in SAMPLING_LIKE_FIELDS if k in body}
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise BadRequest("response_format: expected an object")
    model = body.get("model")
    extra = {k: body[k] for k in ("logprobs", "top_logprobs", "return_logprob") if k in body}
    return ChatRequest(
        messages=messages, stream=stream, include_usage=bool(options.get("include_usage")),
        rid=body.get("rid"), model=model if isinstance(model, str) else None, sampling=sampling,
        stage_params=stage_params, stage_sampling=stage_sampling,
        response_format=response_format, extra=extra,
    )
