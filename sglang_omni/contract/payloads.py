"""The stage wire payloads the built-in engines speak, by role.

The transport (``Job.payload``, ``StageResult.payload``, a ``Dispatch``) carries any mapping, so
another pipeline's adapter may define its own; these are what the reasoner and generation engines
read and return. Inline media in reasoner messages are content parts whose url is
``omni-frame://N``: the bytes are ``job.frames[N]``. The adapter a reasoner serializes decisions
for is a stage start-up fact (``EngineSpec.umm_adapter``), never part of a payload.
"""

from __future__ import annotations

from typing import Any, Required, TypedDict

#: ``ReasonerPayload.options`` keys: the request's log probability fields.
REASONER_OPTION_FIELDS = ("logprobs", "top_logprobs")


# --- reasoner ---------------------------------------------------------------------------------
class ReasonerOptions(TypedDict, total=False):
    logprobs: bool
    top_logprobs: int


class ReasonerPayload(TypedDict, total=False):
    """One Reasoner turn. ``sampling`` holds the client's sampling fields; ``stage_params``
    native chat request fields (they win over ``sampling``); ``turn_index`` counts the
    request's Reasoner turns from 0; ``message_offset`` is how many messages Omni put before the
    client's (its instructions), so an error about ``messages[i]`` names the client's
    ``messages[i - message_offset]``."""

    messages: Required[list[dict[str, Any]]]
    sampling: dict[str, Any]
    stage_params: dict[str, Any]
    response_format: dict[str, Any] | None
    stream: bool
    turn_index: int
    options: ReasonerOptions
    message_offset: int


def reasoner_fields(payload: ReasonerPayload) -> dict[str, Any]:
    """A turn's sampling and native fields merged as the precedence rule says
    (``pipeline.chat_request.sampling_layers``): ``stage_params`` win over ``sampling``."""
    return {**(payload.get("sampling") or {}), **(payload.get("stage_params") or {})}


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ReasonerResult(TypedDict, total=False):
    """A Reasoner turn's answer; ``logprobs`` (OpenAI chat shape) only when asked."""

    text: Required[str]
    finish_reason: Required[str]
    usage: Required[Usage | None]
    logprobs: dict[str, Any]


class TextChunk(TypedDict):
    """A streamed delta. The first is sent once the request is accepted (it may be empty), so
    the server answers a refused streaming request with its HTTP status."""

    text: str


# --- generation -------------------------------------------------------------------------------
class GenerationPayload(TypedDict, total=False):
    """One generation. ``modality`` ``image`` or ``video`` takes ``prompt`` and ``options``
    (``stage_params.generation``); ``action`` (direct generation only) takes ``request``, the
    native action route's JSON body."""

    modality: Required[str]
    prompt: str
    options: dict[str, Any]
    request: dict[str, Any]


class MediaItem(TypedDict):
    """A generated medium; its bytes are ``StageResult.frames[frame]``."""

    kind: str
    mime_type: str
    frame: int


class MediaResult(TypedDict):
    """An image or video generation's answer: ``media`` is empty when the model produced
    nothing, and ``reason`` says why."""

    media: list[MediaItem]
    reason: str | None


class ActionResult(TypedDict):
    """An action generation's answer: the native action route's response body."""

    action: dict[str, Any]


class ProgressChunk(TypedDict):
    """Denoising progress: ``step`` of ``steps`` (None when the engine does not know)."""

    step: int
    steps: int | None
