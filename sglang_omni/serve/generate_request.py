"""Parse ``/generate`` bodies of the interleaved pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.errors import BadRequest
from sglang_omni.serve.chat_request import SAMPLING_LIKE_FIELDS, parse_chat_request
from sglang_omni.serve.schemas.chat import LOGPROB_OPTIONS, ROLLOUT_ARTIFACTS, GenerateRequest
from sglang_omni.serve.validation import validate

FIELDS = ("prompt", "messages", "images", "videos", "stream", "rid", "model", "stage_params",
          "stage_sampling", "include_progress") + SAMPLING_LIKE_FIELDS + ROLLOUT_ARTIFACTS \
    + LOGPROB_OPTIONS


@dataclass
class ParsedGenerate:
    """A checked ``/generate`` request, ready for the orchestrator."""

    rid: Any
    stream: bool
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    stage_params: dict[str, dict[str, Any]]
    stage_sampling: dict[str, dict[str, Any]]
    chat_body: dict[str, Any]
    model: str | None = None
    #: Send ``event: progress`` events on the stream (``include_progress``).
    include_progress: bool = False


def parse_generate_request(body: Any, stages: tuple[str, ...]) -> ParsedGenerate:
    """``prompt`` (or ``messages``), chat media, sampling and stage fields; rollout artifacts
    are refused, since interleaved results carry none."""
    fields = validate(GenerateRequest, body).model_dump(exclude_unset=True)
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
    prompt, messages = fields.get("prompt"), fields.get("messages")
    if (prompt is None) == (messages is None):
        raise BadRequest("give exactly one of prompt (a string) or messages (a chat list)")
    if prompt is not None:
        if not prompt.strip():
            raise BadRequest("prompt: expected a non-empty string")
        messages = [{"role": "user", "content": prompt}]
    include_progress = bool(fields.get("include_progress"))
    if include_progress and not fields.get("stream"):
        raise BadRequest("include_progress: progress is sent on a stream only; set stream to "
                         "true or leave include_progress unset")
    chat_body = {k: v for k, v in fields.items()
                 if k not in ("prompt", "include_progress") + ROLLOUT_ARTIFACTS + LOGPROB_OPTIONS}
    chat_body["messages"] = messages
    req = parse_chat_request(chat_body, known_stages=stages)
    return ParsedGenerate(req.rid, req.stream, req.messages, req.sampling, req.stage_params,
                          req.stage_sampling, chat_body, req.model, include_progress)
