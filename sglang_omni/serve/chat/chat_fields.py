"""The field rules of chat request bodies (``/v1/chat/completions`` and ``/generate``).

Each raises BadRequest naming the field path and what to change; the wire models
(:mod:`sglang_omni.serve.schemas.chat`) are built from these rules and tables, and the request
parsers apply them to native fields under ``stage_params`` too.
"""

from __future__ import annotations

from typing import Any

from sglang_omni.errors import BadRequest
from sglang_omni.media.content_parts import CHAT_MEDIA_PART_KEYS, ContentPart, message_parts

#: Fields that take a number (int or float) and those that take a whole number; null is unset.
NUMBER_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
INTEGER_FIELDS = ("top_k", "seed", "max_tokens", "max_completion_tokens", "min_tokens", "n",
                  "top_logprobs")
ROLES = ("system", "user", "assistant", "developer")
PART_TYPES = ("text", *CHAT_MEDIA_PART_KEYS)
#: The keys of ``stream_options``: native SGLang's two (``include_usage``,
#: ``continuous_usage_stats``) and Omni's ``include_progress``; each takes true, false or null.
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_progress")


def check_messages(messages: Any) -> None:
    """BadRequest at the first invalid message of ``messages``."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of chat messages")
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
            for part in message_parts(i, content):
                check_part(part)
        elif not isinstance(content, str):
            raise BadRequest(f"{where}.content: expected a string or a list of content parts")


def check_part(part: ContentPart) -> None:
    """BadRequest unless ``part`` is a text, image_url, video_url or audio_url content part."""
    where = part.where
    if not isinstance(part.part, dict):
        raise BadRequest(f"{where}: expected a content part object")
    if part.type not in PART_TYPES:
        raise BadRequest(f"{where}.type: expected one of {', '.join(PART_TYPES)}, got "
                         f"{part.part.get('type')!r}")
    if part.kind == "text":
        if not isinstance(part.part.get("text"), str):
            raise BadRequest(f"{where}.text: expected a string")
        return
    if not part.url:
        raise BadRequest(f"{part.label}: expected {{\"url\": \"...\"}} with a non-empty url")


def check_stream_options(options: Any) -> None:
    """``stream_options``: an object of :data:`STREAM_OPTIONS` keys, each true, false or null
    (a boolean, never a string or a number, as native SGLang and the OpenAI API check it).
    ``continuous_usage_stats`` true is refused: usage is counted once, for the last chunk."""
    if not isinstance(options, dict):
        raise BadRequest("stream_options: expected an object, for example "
                         '{"include_usage": true}')
    for key, value in options.items():
        where = f"stream_options.{key}"
        if key not in STREAM_OPTIONS:
            raise BadRequest(f"{where}: not a stream option of this server; use "
                             f"{', '.join(STREAM_OPTIONS)}")
        if value is not None and not isinstance(value, bool):
            raise BadRequest(f"{where}: expected true or false, got {repr(value)[:60]}")
    if options.get("continuous_usage_stats"):
        raise BadRequest("stream_options.continuous_usage_stats: usage is sent once, on the "
                         "last chunk; use include_usage and set continuous_usage_stats to "
                         "false or leave it out")


def check_media_list(kind: str, items: Any) -> None:
    """``images``/``videos``: a list of url strings or ``{"url": ...}`` objects."""
    if not isinstance(items, list):
        raise BadRequest(f"{kind}s: expected a list of urls")
    for i, ref in enumerate(items):
        url = ref.get("url") if isinstance(ref, dict) else ref
        if not isinstance(url, str) or not url:
            raise BadRequest(f"{kind}s[{i}]: expected a url string or {{\"url\": \"...\"}}")


def check_stage_table(key: str, value: Any) -> None:
    """``stage_params``/``stage_sampling``: an object of stage name to an object of fields;
    the sampling number fields in it are numbers, as at the top level."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise BadRequest(f"{key}: expected an object of stage name to an object of fields, "
                         f"for example {{\"reasoner\": {{\"temperature\": 0.2}}}}")
    for stage, fields in value.items():
        check_number_fields(f"{key}.{stage}.", fields)


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
