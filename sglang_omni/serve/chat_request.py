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

from sglang_omni.contract.job import OMNI_OWNED_FIELDS
from sglang_omni.errors import BadRequest
from sglang_omni.media.content_parts import CLIENT_LABEL_KEY
from sglang_omni.pipeline.chat_request import (
    LENGTH_STOP_FIELDS,
    OUTPUT_FIELDS,
    SAMPLING_FIELDS,
    ChatRequest,
)
from sglang_omni.serve.schemas.chat import ChatCompletionRequest
from sglang_omni.serve.validation import validate

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


def parse_chat_request(body: Any, *, reasoner_stage: str = "reasoner",
                       known_stages: tuple[str, ...] = ("reasoner",)) -> ChatRequest:
    """Check ``body`` (a ``ChatCompletionRequest`` or the parsed JSON of one) and build a
    ChatRequest; raises BadRequest naming the field and fix. Field types are the model's
    rules; this function adds the rules between fields and the refusals."""
    fields = validate(ChatCompletionRequest, body).model_dump(exclude_unset=True)
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
    messages = copy.deepcopy(fields["messages"])
    for kind in ("image", "video"):
        items = fields.get(f"{kind}s")
        if items is None:
            continue
        users = [m for m in messages if m["role"] == "user"]
        if not users:
            raise BadRequest(f"{kind}s: there is no user message to add the {kind}s to")
        last = users[-1]
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"].extend(_media_part(kind, ref, f"{kind}s[{k}]")
                               for k, ref in enumerate(items))
    stage_params = copy.deepcopy(fields.get("stage_params") or {})
    stage_sampling = copy.deepcopy(fields.get("stage_sampling") or {})
    for key, table in (("stage_params", stage_params), ("stage_sampling", stage_sampling)):
        for stage in table:
            if stage not in known_stages:
                raise BadRequest(f"{key}.{stage}: no such stage; this pipeline has "
                                 f"{', '.join(known_stages)}")
    for stage in stage_sampling:
        if stage != reasoner_stage:
            raise BadRequest(f"stage_sampling.{stage}: only the {reasoner_stage} stage samples "
                             f"tokens; put the {stage} stage's native fields (seed, guidance "
                             f"and the like) under stage_params.{stage} and remove "
                             f"stage_sampling.{stage}")
    refuse_single_completion_fields("", fields, stream)
    native_fields = stage_params.get(reasoner_stage, {})
    refuse_single_completion_fields(f"stage_params.{reasoner_stage}.", native_fields, stream)
    for key in native_fields:
        where = f"stage_params.{reasoner_stage}.{key}"
        if key in OMNI_OWNED_FIELDS:
            raise BadRequest(f"{where}: Omni sets it from the request; use the top-level "
                             "field and remove it here")
        if key in VIDEO_PROCESSING_FIELDS or key in ("audios", "images", "videos"):
            raise BadRequest(f"{where}: native SGLang reads media only from content parts; "
                             "put the media in the messages and remove it here")
    options = fields.get("stream_options") or {}
    include_progress = options.get("include_progress", False)
    if not isinstance(include_progress, bool):
        raise BadRequest(f"stream_options.include_progress: expected true or false, got "
                         f"{include_progress!r}")
    if include_progress and not stream:
        raise BadRequest("stream_options.include_progress: progress is sent on a stream only; "
                         "set stream to true or leave include_progress unset")
    sampling = {k: fields[k] for k in SAMPLING_LIKE_FIELDS if k in fields}
    extra = {k: fields[k] for k in ("logprobs", "top_logprobs", "return_logprob") if k in fields}
    return ChatRequest(
        messages=messages, stream=stream, include_usage=bool(options.get("include_usage")),
        include_progress=include_progress,
        rid=fields.get("rid"), model=fields.get("model"), sampling=sampling,
        stage_params=stage_params, stage_sampling=stage_sampling,
        response_format=fields.get("response_format"), extra=extra,
    )
