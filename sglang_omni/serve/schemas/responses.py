"""Response bodies, for ``/openapi.json`` and ``/docs`` (the routes build them as JSON)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str = Field(description="what went wrong and what to change")
    type: str = Field(description="e.g. invalid_request_error, service_unavailable_error")
    code: int = Field(description="the HTTP status")


class ErrorBody(BaseModel):
    """Every refusal and failure: 4xx and 5xx answers, and a stream's ``event: error``."""

    error: ErrorDetail


class MediaData(BaseModel):
    kind: Literal["image", "video"]
    mime_type: str
    size_bytes: int
    sha256: str
    url: str = Field(description="data:<mime>;base64,<bytes>")


class Segment(BaseModel):
    """One ordered output of an interleaved request: text or a generated image or video."""

    type: Literal["segment"] = "segment"
    execution_id: str
    segment_index: int
    kind: Literal["text", "image", "video"]
    data: str | MediaData | None = Field(
        None, description="the text, or the media; the stream's complete event lists segments "
        "without it")


class GenerateResponse(BaseModel):
    """``/generate`` with ``stream: false`` (streaming sends ``event: segment`` per segment,
    then ``event: complete`` and ``data: [DONE]``)."""

    execution_id: str
    text: str = Field(description="the text segments joined")
    segments: list[Segment]
    finish_reason: str
    usage: dict[str, Any] | None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    segments: list[Segment] | None = Field(None, description="interleaved pipeline: every "
                                           "segment in order")


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: str
    logprobs: dict[str, Any] | None = None


class ChatCompletion(BaseModel):
    """``/v1/chat/completions`` with ``stream: false`` (streaming sends
    ``chat.completion.chunk`` objects, then ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, Any] | None


class ImageData(BaseModel):
    b64_json: str
    revised_prompt: str


class ImageGenerationResponse(BaseModel):
    id: str
    created: int
    data: list[ImageData]
    inference_time_s: float | None


class VideoJob(BaseModel):
    """A ``/v1/videos`` job; ``GET /v1/videos/{id}/content`` returns the MP4 once
    ``status`` is ``completed``."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed", "deleted"]
    progress: int
    created_at: int
    size: str
    seconds: str
    quality: str
    url: str | None
    completed_at: int | None
    expires_at: int | None
    error: ErrorDetail | None
    inference_time_s: float | None


class VideoJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoJob]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str
    root: str | None
    pipeline: str
    mode: Literal["umm", "chat", "generation"] = Field(
        description="what the server serves: umm (interleaved), chat (text-only) or generation "
        "(direct generation)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class StageHealth(BaseModel):
    status: str
    pid: int | None
    exitcode: int | None
    restarts: int
    restart_in_s: float | None = Field(
        None, description="while the stage is restarting: the seconds until its new process "
        "starts (the rest of its cool-down once its restart budget is spent, or of its "
        "backoff; 0 while the new process starts up), which the 503's Retry-After also says; "
        "null otherwise")
    last_fault: str | None = Field(
        None, description="why the stage's last process failed (it exited, stopped answering "
        "its heartbeat or made no progress on its jobs), null while none has")
    gpu_memory: dict[str, int] | None = Field(
        None, description="the stage's CUDA memory at its last heartbeat, in bytes: "
        "allocated (tensors held now), reserved (held by PyTorch's cache) and peak (the most "
        "allocated since the stage started); null for a stage that does not use CUDA itself "
        "(scripted, CPU, native)")


class Health(BaseModel):
    """200 when ``status`` is ``ok``; 503 with ``Retry-After`` otherwise."""

    status: Literal["ok", "starting", "stalled", "restarting", "unhealthy"]
    stages: dict[str, StageHealth]


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (400, "invalid request: the message names the field and what to change"),
        (401, "missing or invalid API key"),
        (413, "body over server.max_body_bytes"),
        (503, "over capacity or a stage is restarting; see Retry-After"),
    )}


class Progress(BaseModel):
    """A progress event, sent only on a stream that asked for it (``include_progress`` on
    ``/generate``: ``event: progress``; ``stream_options.include_progress`` on chat:
    ``choices[0].delta.progress``). A Reasoner turn starting: ``stage`` ``reasoner``; a
    generation step: ``stage`` ``generation`` with its modality, index and steps."""

    stage: Literal["reasoner", "generation"]
    turn: int = Field(description="the Reasoner turn (1 = the first) running, or that asked "
                      "for the generation")
    elapsed_s: float = Field(description="seconds since the request was admitted")
    modality: Literal["image", "video"] | None = None
    generation: int | None = Field(None, description="the request's generation (1 = the first)")
    step: int | None = Field(None, description="denoising steps done (0: started)")
    steps: int | None = Field(None, description="denoising steps in all (null until the engine "
                              "says)")


class PlannedRequest(BaseModel):
    rid: str
    phase: str = Field(description="reasoning, deciding, queued, generating or paused (its "
                       "generation waits for an older request's, on the stage)")
    allowance: int = Field(description="generations the plan still allows")
    used: int = Field(description="generations queued or run so far")
    deadline_in_s: float = Field(description="seconds until its timeout_s deadline")
    finish_in_s: float | None = Field(None, description="when the plan expects it to end "
                                      "(null before any generation was measured)")


class Queue(BaseModel):
    """The interleaved pipeline's admission and deadline plan, in generation-stage order."""

    active: int
    max_active: int
    client_media_bytes: int = Field(description="client media bytes the running requests hold "
                                    "or reserved (a request reserves the most its media may "
                                    "take before any fetch)")
    max_client_media_bytes: int = Field(description="server.max_client_media_bytes")
    queued_generations: int
    plan: list[PlannedRequest]
    measured: dict[str, Any] = Field(description="the planner's times in seconds: reasoner_s "
                                     "(longest turn), longest_s and shortest_s by modality, step_s "
                                     "(longest seconds per denoising step) by modality")


#: Routes that name a model: 404 when it is not the served one.
MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 404: {"model": ErrorBody, "description": "model: not the served model "
                    "(GET /v1/models)"}}
