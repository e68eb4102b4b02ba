"""Parse and check an OpenAI chat request body into a ``ChatRequest``.

Rules (native chat stage spec): messages carry text, image_url, video_url and audio_url parts;
top-level ``images``/``videos`` are added to the last user message; top-level ``audios`` and video
processing options are refused; other native fields go under ``stage_params.<stage>``; tools,
``n`` above 1 and log probabilities on a stream are refused; number fields take numbers, never
booleans. All refusals are 400.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sglang_omni.contract.job import refuse_omni_owned
from sglang_omni.errors import BadRequest
from sglang_omni.media.content_parts import CLIENT_LABEL_KEY
from sglang_omni.pipeline.chat_request import (
    LENGTH_STOP_FIELDS,
    OUTPUT_FIELDS,
    SAMPLING_FIELDS,
    ChatRequest,
    check_stage_names,
)
from sglang_omni.serve.schemas.chat import ChatCompletionRequest
from sglang_omni.serve.wire.validation import validate

#: Top-level fields that go to the Reasoner with the request's sampling.
SAMPLING_LIKE_FIELDS = SAMPLING_FIELDS + LENGTH_STOP_FIELDS + OUTPUT_FIELDS
#: Native video processing options: refused (native reads video only from content parts).
VIDEO_PROCESSING_FIELDS = ("video_fps", "video_max_frames", "video_min_frames", "max_frames",
                           "fps", "video_max_pixels", "video_min_pixels", "do_sample_frames")
ENVELOPE_FIELDS = ("model", "messages", "stream", "stream_options", "rid", "images", "videos",
                   "stage_params", "stage_sampling", "user", "n", "tools", "tool_choice",
                   "logprobs", "top_logprobs", "response_format", "return_logprob")


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


def _media_part(kind: str, ref: Any, label: str) -> dict[str, Any]:
    """The content part of a top-level ``images``/``videos`` item; ``label`` is where the
    client put it (errors name it so)."""
    url = ref.get("url") if isinstance(ref, dict) else ref
    key = f"{kind}_url"
    return {"type": key, key: {"url": url}, CLIENT_LABEL_KEY: label}


def set_fields(body: BaseModel) -> dict[str, Any]:
    """The fields the client set, in the order of ``model_dump(exclude_unset=True)`` (declared
    fields, then unknown ones), holding the values as sent: no copy, no second validation."""
    present = body.model_fields_set
    fields = {key: getattr(body, key) for key in type(body).model_fields if key in present}
    fields.update(body.model_extra or {})
    return fields


def with_top_level_media(messages: list[dict[str, Any]], fields: dict[str, Any]
                         ) -> list[dict[str, Any]]:
    """``messages`` with the top-level ``images``/``videos`` added to the last user message;
    the client's list and messages are left as sent (only what changes is copied)."""
    for kind in ("image", "video"):
        items = fields.get(f"{kind}s")
        if items is None:
            continue
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise BadRequest(f"{kind}s: there is no user message to add the {kind}s to")
        last = dict(messages[users[-1]])
        content = last["content"]
        last["content"] = [{"type": "text", "text": content}] if isinstance(content, str) \
            else list(content)
        last["content"].extend(_media_part(kind, ref, f"{kind}s[{k}]")
                               for k, ref in enumerate(items))
        messages = [*messages[:users[-1]], last, *messages[users[-1] + 1:]]
    return messages


def parse_chat_request(body: Any, *, reasoner_stage: str = "reasoner",
                       known_stages: tuple[str, ...] = ("reasoner",)) -> ChatRequest:
    """Check ``body`` (a ``ChatCompletionRequest``, as the route validated it, or the parsed
    JSON of one) and build a ChatRequest; raises BadRequest naming the field and fix. Field
    types are the model's rules; this function adds the rules between fields and the
    refusals."""
    return parse_chat_fields(set_fields(validate(ChatCompletionRequest, body)),
                             reasoner_stage=reasoner_stage, known_stages=known_stages)


def parse_chat_fields(fields: dict[str, Any], *, reasoner_stage: str = "reasoner",
                      known_stages: tuple[str, ...] = ("reasoner",)) -> ChatRequest:
    """:func:`parse_chat_request` of a validated body's :func:`set_fields` (the route walks the
    body once and hands the same fields to the media check)."""
    for key in ("audios",):
        if key in fields:
            raise BadRequest("audios: top-level audio lists are not read by native SGLang; put "
                             "each audio in the messages as an audio_url content part")
    for key in VIDEO_PROCESSING_FIELDS:
        if key in fields:
            raise BadRequest(f"{key}: video processing options are not accepted; native SGLang "
                             "reads video only from video_url content parts")
    unknown = [k for k in fields if k not in ENVELOPE_FIELDS + SAMPLING_LIKE_FIELDS]
    if unknown:
        raise BadRequest(f"{unknown[0]}: not a field of this route; put other native chat "
                         f"fields under stage_params.{reasoner_stage}")
    stream = bool(fields.get("stream"))
    options = fields.get("stream_options") or {}
    include_progress = options.get("include_progress") is True  # the schema checked the type
    req = chat_request_of(fields, fields["messages"], stream=stream,
                          reasoner_stage=reasoner_stage, known_stages=known_stages)
    check_progress_needs_stream("stream_options.include_progress", include_progress, stream)
    req.include_usage = options.get("include_usage") is True
    req.include_progress = include_progress
    return req


def check_progress_needs_stream(where: str, include_progress: bool, stream: bool) -> None:
    """Progress is sent on a stream only (``include_progress`` of ``/generate`` and
    ``stream_options.include_progress`` of the chat route)."""
    if include_progress and not stream:
        raise BadRequest(f"{where}: progress is sent on a stream only; set stream to true or "
                         "leave include_progress unset")


def chat_request_of(fields: dict[str, Any], messages: list[dict[str, Any]], *, stream: bool,
                    reasoner_stage: str, known_stages: tuple[str, ...]) -> ChatRequest:
    """The rules between a validated body's ``fields`` (as :func:`set_fields` gives them) that
    both chat bodies share, and the ChatRequest they make; ``messages`` are already checked."""
    messages = with_top_level_media(messages, fields)
    stage_params = fields.get("stage_params") or {}
    stage_sampling = fields.get("stage_sampling") or {}
    check_stage_names("stage_params", stage_params, known_stages)
    check_stage_names("stage_sampling", stage_sampling, known_stages)
    for stage in stage_sampling:
        if stage != reasoner_stage:
            raise BadRequest(f"stage_sampling.{stage}: only the {reasoner_stage} stage samples "
                             f"tokens; put the {stage} stage's native fields (seed, guidance "
                             f"and the like) under stage_params.{stage} and remove "
                             f"stage_sampling.{stage}")
    refuse_single_completion_fields("", fields, stream)
    native_fields = stage_params.get(reasoner_stage, {})
    refuse_single_completion_fields(f"stage_params.{reasoner_stage}.", native_fields, stream)
    refuse_omni_owned(f"stage_params.{reasoner_stage}.", native_fields)
    for key in native_fields:
        where = f"stage_params.{reasoner_stage}.{key}"
        if key in VIDEO_PROCESSING_FIELDS or key in ("audios", "images", "videos"):
            raise BadRequest(f"{where}: native SGLang reads media only from content parts; "
                             "put the media in the messages and remove it here")
    sampling = {k: fields[k] for k in SAMPLING_LIKE_FIELDS if k in fields}
    extra: dict[str, Any] = {k: fields[k] for k in ("logprobs", "top_logprobs", "return_logprob")
                             if k in fields}
    return ChatRequest(
        messages=messages, stream=stream, rid=fields.get("rid"), model=fields.get("model"),
        sampling=sampling, stage_params=stage_params, stage_sampling=stage_sampling,
        response_format=fields.get("response_format"), extra=extra,
    )
