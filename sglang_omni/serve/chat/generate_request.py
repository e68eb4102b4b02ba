"""Parse ``/generate`` bodies of the interleaved pipeline."""

from __future__ import annotations

from typing import Any

from sglang_omni.errors import BadRequest
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.serve.chat.chat_fields import check_messages
from sglang_omni.serve.chat.chat_request import (
    SAMPLING_LIKE_FIELDS,
    chat_request_of,
    check_progress_needs_stream,
    set_fields,
)
from sglang_omni.serve.schemas.chat import LOGPROB_OPTIONS, ROLLOUT_ARTIFACTS, GenerateRequest
from sglang_omni.serve.wire.validation import validate

FIELDS = ("prompt", "messages", "images", "videos", "stream", "rid", "model", "stage_params",
          "stage_sampling", "include_progress") + SAMPLING_LIKE_FIELDS + ROLLOUT_ARTIFACTS \
    + LOGPROB_OPTIONS


def parse_generate_request(body: Any, stages: tuple[str, ...]) -> ChatRequest:
    """``prompt`` (or ``messages``), chat media, sampling and stage fields; rollout artifacts
    are refused, since interleaved results carry none. ``body``: a ``GenerateRequest`` as the
    route validated it (or the parsed JSON of one); read once, never re-validated."""
    return parse_generate_fields(set_fields(validate(GenerateRequest, body)), stages)


def parse_generate_fields(fields: dict[str, Any], stages: tuple[str, ...]) -> ChatRequest:
    """:func:`parse_generate_request` of a validated body's :func:`set_fields` (the route walks
    the body once and hands the same fields to the media check)."""
    for key in fields:
        if key not in FIELDS:
            raise BadRequest(f"{key}: not a field of /generate on the interleaved pipeline; put "
                             "native fields under stage_params.reasoner or "
                             "stage_params.generation")
    for key in ROLLOUT_ARTIFACTS:
        if fields.get(key):
            raise BadRequest(f"{key}: interleaved results carry no logprobs or other rollout "
                             "artifacts; leave it unset")
    for key in LOGPROB_OPTIONS:
        if fields.get(key) is not None:
            raise BadRequest(f"{key}: interleaved results carry no logprobs; leave it unset")
    prompt = fields.get("prompt")
    messages: list[dict[str, Any]] = fields.get("messages")  # type: ignore[assignment]
    if (prompt is None) == (messages is None):
        raise BadRequest("give exactly one of prompt (a string) or messages (a chat list)")
    if prompt is not None:
        if not prompt.strip():
            raise BadRequest("prompt: expected a non-empty string")
        messages = [{"role": "user", "content": prompt}]
    stream = bool(fields.get("stream"))
    include_progress = bool(fields.get("include_progress"))
    check_progress_needs_stream("include_progress", include_progress, stream)
    if prompt is None:
        check_messages(messages)  # the chat route's rule (its model checks them as they arrive)
    req = chat_request_of(fields, messages, stream=stream, reasoner_stage="reasoner",
                          known_stages=stages)
    req.include_progress = include_progress
    return req
