"""Request bodies of ``POST /v1/chat/completions`` and ``POST /generate``.

Sampling, length and stop fields are the native chat request's (see
:mod:`sglang_omni.pipeline.chat_request`); each number field is checked by
:func:`~sglang_omni.serve.chat.chat_fields.check_number_fields`, messages by
:func:`~sglang_omni.serve.chat.chat_fields.check_messages`.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from pydantic import Field, create_model

from sglang_omni.pipeline.chat_request import LENGTH_STOP_FIELDS, OUTPUT_FIELDS, SAMPLING_FIELDS
from sglang_omni.serve.chat.chat_fields import (
    INTEGER_FIELDS,
    NUMBER_FIELDS,
    PART_TYPES,
    ROLES,
    check_media_list,
    check_messages,
    check_number_fields,
    check_stage_table,
    check_stream_options,
)
from sglang_omni.serve.schemas.fields import (
    BOOLEAN,
    OBJECT,
    STRING,
    Checked,
    WireModel,
    checked,
    documented,
)

MEDIA_URL = {"oneOf": [{"type": "string"}, {"type": "object", "required": ["url"],
                                            "properties": {"url": {"type": "string"}}}]}
CONTENT_PART = {
    "type": "object", "required": ["type"],
    "properties": {"type": {"enum": list(PART_TYPES)}, "text": {"type": "string"},
                   **{kind: MEDIA_URL for kind in PART_TYPES if kind != "text"}},
}
MESSAGE = {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": list(ROLES)},
                   "content": {"oneOf": [{"type": "string"},
                                         {"type": "array", "items": CONTENT_PART}]}},
}
MESSAGES = checked(check_messages, {"type": "array", "items": MESSAGE, "minItems": 1},
                   "messages", null_is_unset=False)  # chat's one required field
STAGE_TABLE = {"type": "object", "additionalProperties": {"type": "object"},
               "description": "stage name -> native fields of that stage"}
STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
PASSED_ON: dict[str, dict[str, Any]] = {
    "stop": STOP, "stop_token_ids": {"type": "array", "items": {"type": "integer"}},
    "ignore_eos": {"type": "boolean"}, "no_stop_trim": {"type": "boolean"},
    "skip_special_tokens": {"type": "boolean"},
}


#: What the length and stop fields do on each pipeline (the interleaved one accepts them and
#: never applies them: the decision format bounds every decision's length).
LENGTH_STOP_NOTE = ("text-only chat: applies to the completion; interleaved pipeline: accepted "
                    "and ignored, since the decision format bounds every Reasoner decision")


def _number_field(key: str) -> Checked:
    schema: dict[str, Any] = {"type": "integer" if key in INTEGER_FIELDS else "number"}
    if key in LENGTH_STOP_FIELDS:
        schema["description"] = LENGTH_STOP_NOTE
    return checked(lambda value: check_number_fields("", {key: value}), schema, key)


def _stage_table(key: str) -> Checked:
    return checked(partial(check_stage_table, key), STAGE_TABLE, key)


def _media_list(kind: str) -> Checked:
    return checked(partial(check_media_list, kind),
                   {"type": "array", "items": MEDIA_URL,
                    "description": f"{kind}s added to the last user message"}, f"{kind}s")


#: The sampling, length, stop and output fields, built from their tables (one home each).
SAMPLING_MODEL_FIELDS: dict[str, Any] = {
    **{key: (Annotated[Any, _number_field(key)], None)
       for key in (*NUMBER_FIELDS, *INTEGER_FIELDS)},
    **{key: (Annotated[Any, documented(
        PASSED_ON[key], LENGTH_STOP_NOTE if key in LENGTH_STOP_FIELDS else "")], None)
       for key in (*SAMPLING_FIELDS, *LENGTH_STOP_FIELDS, *OUTPUT_FIELDS)
       if key not in NUMBER_FIELDS + INTEGER_FIELDS},
}
SamplingFields = create_model("SamplingFields", __base__=WireModel, **SAMPLING_MODEL_FIELDS)

RID = documented({"type": "string"}, "request id; unique among requests in flight and of the "
                 "last 10 minutes")
STAGE_PARAMS = _stage_table("stage_params")
STAGE_SAMPLING = _stage_table("stage_sampling")
IMAGES = _media_list("image")
VIDEOS = _media_list("video")
STREAM_OPTIONS = checked(check_stream_options, {
    "type": "object", "additionalProperties": False,
    "properties": {
        "include_usage": {"type": ["boolean", "null"],
                          "description": "adds usage to the last chunk"},
        "continuous_usage_stats": {"type": ["boolean", "null"],
                                   "description": "native's; only false is served (usage comes "
                                   "once, with include_usage)"},
        "include_progress": {"type": ["boolean", "null"],
                             "description": "interleaved pipeline: adds chunks with "
                             "choices[0].delta.progress: the Reasoner turn and each "
                             "generation's steps"}}}, "stream_options")
CHAT_ONLY = documented({"type": "boolean"}, "text-only chat, non-streaming")
TOOLS = documented({"type": "array", "items": {"type": "object"}},
                   "refused: run sglang serve for native tool calls")
TOOL_CHOICE = documented({}, 'only "none" is served')
USER = STRING


class ChatFields(SamplingFields):  # type: ignore[misc,valid-type]
    """Fields shared by the chat route and ``/generate``."""

    model: Annotated[Any, STRING] = Field(None, description="the served model (GET /v1/models)")
    rid: Annotated[Any, RID] = None
    stream: Annotated[Any, BOOLEAN] = None
    images: Annotated[Any, IMAGES] = None
    videos: Annotated[Any, VIDEOS] = None
    stage_params: Annotated[Any, STAGE_PARAMS] = Field(
        None, description='native fields per stage, e.g. {"generation": {"width": 640}}')
    stage_sampling: Annotated[Any, STAGE_SAMPLING] = Field(
        None, description='sampling fields of the Reasoner, e.g. {"reasoner": {"top_p": 0.9}}; '
        "any other stage is refused (its fields go under stage_params)")


class ChatCompletionRequest(ChatFields):
    """An OpenAI chat completion request, with Omni's ``stage_params``/``stage_sampling``."""

    messages: Annotated[Any, MESSAGES] = Field(..., description="the conversation")
    stream_options: Annotated[Any, STREAM_OPTIONS] = Field(
        None, description='booleans (true, false or null; any other key or value is a 400): '
        '{"include_usage": true} adds usage to the last chunk; '
        '{"include_progress": true} (interleaved pipeline) adds chunks with '
        "choices[0].delta.progress: the Reasoner turn and each generation's steps; native's "
        "continuous_usage_stats is accepted as false only")
    response_format: Annotated[Any, OBJECT] = Field(
        None, description="text-only chat: a JSON schema or regex constraint; the interleaved "
        "pipeline sets its own")
    user: Annotated[Any, USER] = None
    tools: Annotated[Any, TOOLS] = None
    tool_choice: Annotated[Any, TOOL_CHOICE] = None
    logprobs: Annotated[Any, CHAT_ONLY] = None
    return_logprob: Annotated[Any, CHAT_ONLY] = None


ROLLOUT_ARTIFACTS = ("return_logprob", "return_hidden_states", "return_routed_experts",
                     "return_text_in_logprobs", "return_entropy", "return_prompt_token_ids")
LOGPROB_OPTIONS = ("logprob_start_len", "top_logprobs_num", "token_ids_logprob")
REFUSED = documented({}, "refused: interleaved results carry no logprobs or other rollout "
                     "artifacts")
_REFUSED_FIELDS: dict[str, Any] = {
    key: (Annotated[Any, REFUSED], None) for key in (*ROLLOUT_ARTIFACTS, *LOGPROB_OPTIONS)}
GenerateFields = create_model("GenerateFields", __base__=ChatFields, **_REFUSED_FIELDS)
GENERATE_MESSAGES = documented({"type": "array", "items": MESSAGE},
                               "the conversation (or give prompt)")


class GenerateRequest(GenerateFields):  # type: ignore[misc,valid-type]
    """``/generate`` of the interleaved pipeline: exactly one of ``prompt`` or ``messages``."""

    prompt: Annotated[Any, STRING] = Field(None, description="the user's request (or messages)")
    messages: Annotated[Any, GENERATE_MESSAGES] = None
    include_progress: Annotated[Any, BOOLEAN] = Field(
        None, description="with stream: also send event: progress (the Reasoner turn and each "
        "generation's steps); off by default")
