"""Omni Reasoner payloads to native chat requests, and native answers back to Omni results.

Plain data work with no sglang import, so the rules are testable without the native extra:

* media: every image, video and audio part goes through the media policy before native SGLang
  sees it (:func:`localize_media`): native SGLang only ever reads a checked local file or a
  temporary file Omni wrote (fetched remote media, inline data, ``omni-frame://N`` media);
* fields: the native chat request is the client's sampling fields, then
  ``stage_params.<stage>`` (which wins), then what Omni owns (messages, stream, request id);
* answers: a native completion body, a native SSE stream or a native error response become the
  stage's result payload, chunks or an :class:`NativeRefusal` carrying native's HTTP status.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sglang_omni.contract.job import FRAME_SCHEME, refuse_omni_owned
from sglang_omni.contract.payloads import (
    REASONER_OPTION_FIELDS,
    ReasonerPayload,
    ReasonerResult,
    Usage,
    reasoner_fields,
)
from sglang_omni.engines.native.frame_files import FrameFiles, write_frame
from sglang_omni.errors import BadRequest, NativeRefusal, ServerError, is_error_status
from sglang_omni.media import LazyMediaDir, MediaPolicy, RequestMediaDir, materialize
from sglang_omni.media.content_parts import message_parts, without_client_label
from sglang_omni.media.gather import gather_within

MEDIA_KINDS = ("image", "video", "audio")


def new_native_rid() -> str:
    """A fresh native request id. All have one length, since native SGLang aborts every request
    whose id starts with the aborted one."""
    return f"omni-{uuid.uuid4().hex}"


# --- media ------------------------------------------------------------------------------------
def _folder(workdir: RequestMediaDir | LazyMediaDir) -> RequestMediaDir:
    return workdir.get() if isinstance(workdir, LazyMediaDir) else workdir


async def _native_ref(ref: str, frames: list[bytes | bytearray], policy: MediaPolicy,
                      workdir: RequestMediaDir | LazyMediaDir, label: str,
                      frame_files: FrameFiles | None) -> str:
    if ref.startswith(FRAME_SCHEME):
        index = ref[len(FRAME_SCHEME):]
        if not index.isdigit() or int(index) >= len(frames):
            raise BadRequest(f"{label}: {ref} names no inline media of this request")
        if frame_files is not None:  # the request's file of the frame, written once
            return await frame_files.uri(frames[int(index)])
        # megabytes written to a file: off the event loop
        return await anyio.to_thread.run_sync(write_frame, frames[int(index)],
                                              _folder(workdir))
    target = await materialize(ref, policy, _folder(workdir), label=label)
    return Path(target).as_uri()  # a checked local file or one of the request's temp files


async def localize_media(messages: list[dict[str, Any]], frames: list[bytes | bytearray],
                         policy: MediaPolicy, workdir: RequestMediaDir | LazyMediaDir,
                         offset: int = 0, frame_files: FrameFiles | None = None
                         ) -> list[dict[str, Any]]:
    """A copy of ``messages`` whose media urls native SGLang can read under ``policy``
    (errors name the client's message indices: ``offset`` is
    ``ReasonerPayload.message_offset``). The parts are read a few at a time, all within the
    policy's ``request_deadline_s`` (:func:`~sglang_omni.media.gather.gather_within`).

    Refused references raise MediaRefused (400) and failed fetches MediaFetchFailed before
    native SGLang loads anything; files written for the turn live in ``workdir`` (a
    ``LazyMediaDir`` is made only when one is written), and the
    ``omni-frame://N`` media in ``frame_files`` (the request's, each frame written once) when
    given, else in ``workdir`` too.
    """
    out: list[dict[str, Any]] = []
    #: (message index in ``out``, part index, the part's body) of each media part, in order
    places: list[tuple[int, int, dict[str, Any]]] = []
    reads: list[tuple[str, Callable[[], Awaitable[str]]]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        parts: list[Any] = []
        for part in message_parts(i - offset, content):
            if part.kind not in MEDIA_KINDS:
                parts.append(part.part)
                continue
            ref = part.ref
            body = dict(ref) if isinstance(ref, dict) else {"url": ref}
            url = part.url
            if not url:
                raise BadRequest(f"{part.label}: expected {{\"url\": \"...\"}} with a non-empty "
                                 "url")
            places.append((len(out), len(parts), body))
            reads.append((part.label, functools.partial(_native_ref, url, frames, policy,
                                                        workdir, part.label, frame_files)))
            parts.append({**without_client_label(part.part), part.type: body})
        out.append({**message, "content": parts})
    urls = await gather_within(reads, policy)
    for (_, _, body), url in zip(places, urls, strict=True):
        body["url"] = url
    return out


# --- request fields ---------------------------------------------------------------------------
def chat_request_fields(payload: ReasonerPayload, messages: list[dict[str, Any]],
                        native_rid: str, known_fields: Collection[str],
                        stage: str = "reasoner") -> dict[str, Any]:
    """The native ChatCompletionRequest fields for a Reasoner payload.

    ``known_fields`` are the native request's field names: a stage_params name outside them,
    or one Omni sets itself, is refused with 400 naming it.
    """
    stage_params = dict(payload.get("stage_params") or {})
    refuse_omni_owned(f"stage_params.{stage}.", stage_params)
    for name in stage_params:
        if name not in known_fields:
            raise BadRequest(f"stage_params.{stage}.{name}: not a native chat request field "
                             "of the pinned SGLang release")
    options = {k: v for k, v in (payload.get("options") or {}).items()
               if k in REASONER_OPTION_FIELDS}
    fields: dict[str, Any] = {**options, **reasoner_fields(payload)}
    if payload.get("response_format") is not None:
        fields["response_format"] = payload["response_format"]
    stream = bool(payload.get("stream"))
    fields.update(messages=messages, stream=stream, rid=native_rid)
    if stream:
        fields["stream_options"] = {"include_usage": True}
    return fields


# --- answers ----------------------------------------------------------------------------------
def refusal_from_error_body(status: int, body: Any) -> NativeRefusal:
    """Map a native error (``{"message", "code", ...}``, possibly under ``"error"``)."""
    error = body.get("error", body) if isinstance(body, dict) else {}
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and is_error_status(code):
        status = code
    return NativeRefusal(f"native SGLang: {message or 'request failed'}", status)


def completion_result(body: dict[str, Any]) -> ReasonerResult:
    """The stage result payload of a native (non-streaming) chat completion body."""
    choices = body.get("choices") or []
    if not choices:
        raise NativeRefusal("native SGLang returned no choice", ServerError.status)
    choice = choices[0]
    result: ReasonerResult = {
        "text": (choice.get("message") or {}).get("content") or "",
        "finish_reason": choice.get("finish_reason") or "stop",
        "usage": _usage(body.get("usage")),
    }
    if choice.get("logprobs") is not None:
        result["logprobs"] = choice["logprobs"]
    return result


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    return Usage(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                 completion_tokens=int(usage.get("completion_tokens") or 0),
                 total_tokens=int(usage.get("total_tokens") or 0))


@dataclass
class StreamReader:
    """Reads native SSE strings: forwards content deltas to ``emit`` as ``{"text"}`` chunks
    (the first, for native's role chunk, empty), and keeps the finish reason and usage."""

    emit: Callable[[dict[str, Any]], None]
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False
    started: bool = False

    def feed(self, sse: str | bytes) -> None:
        """Take one item of native's body iterator; NativeRefusal for a native error event."""
        if isinstance(sse, bytes):
            sse = sse.decode()
        for line in sse.splitlines():
            if not line.startswith("data:"):
                continue  # blank separators, named sglext events
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                continue
            self._chunk(json.loads(data))

    def _chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise refusal_from_error_body(ServerError.status, chunk)
        if chunk.get("usage") is not None:
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = (choice.get("delta") or {}).get("content") or ""
            if delta or not self.started:
                self.started = True
                self.text.append(delta)
                self.emit({"text": delta})
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def result(self) -> ReasonerResult:
        if not self.done:
            raise NativeRefusal("the native stream ended without [DONE]", ServerError.status)
        return {"text": "".join(self.text), "finish_reason": self.finish_reason or "stop",
                "usage": self.usage}
