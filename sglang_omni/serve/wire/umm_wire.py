"""Wire forms of interleaved results: ``/generate`` SSE and JSON, and chat segments.

Progress events (only when the client asked for them) are ``event: progress`` on ``/generate``
and chunks with ``choices[0].delta.progress`` on chat.

Media segments are base64- and JSON-encoded off the event loop (a segment carries up to 8 MiB);
the stream generators end with an error and ``[DONE]`` whatever is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import Any

from sglang_omni.pipeline.progress import Progress
from sglang_omni.pipeline.umm import TEXT, Complete, Segment
from sglang_omni.serve.ops.request_log import note_segment
from sglang_omni.serve.wire.openai_chat import chunk_body, completion_body
from sglang_omni.serve.wire.sse import ERROR_DATA, ERROR_EVENT, ends_with_done, sse_data, sse_event
from sglang_omni.serve.wire.wire_json import base64_url

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def joined_text(segments: tuple[Segment, ...] | list[Segment]) -> str:
    return "".join(s.text or "" for s in segments if s.kind == TEXT)


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """The OpenAI usage of an adapter's ``usage()``: the token counts it reports (an adapter
    may leave any out; ``total_tokens`` is derived when both parts are there)."""
    usage = usage or {}
    out = {k: usage[k] for k in USAGE_KEYS if k in usage}
    if "total_tokens" not in out and "prompt_tokens" in out and "completion_tokens" in out:
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def media_data(segment: Segment) -> dict[str, Any]:
    """A media segment's ``data`` object, the bytes as a base64 data URL in ``url``."""
    assert segment.media is not None
    return {"kind": segment.kind, "mime_type": segment.mime_type,
            "size_bytes": len(segment.media), "sha256": segment.sha256,
            "url": base64_url(str(segment.mime_type), segment.media)}


def _segment_event(segment: Segment) -> str:
    return sse_event("segment", segment_wire(segment))


def _segment_chunk(rid: str, model: str, segment: Segment) -> str:
    return sse_data(chunk_body(rid, model, _segment_delta(segment)))


def segment_wire(segment: Segment, with_data: bool = True) -> dict[str, Any]:
    """A segment's wire form; ``with_data=False`` gives the reference ``event: complete`` lists:
    type, execution_id, segment_index and kind, without ``data`` (the spec's "references
    without data")."""
    body: dict[str, Any] = {"type": "segment", "execution_id": segment.execution_id,
                            "segment_index": segment.segment_index, "kind": segment.kind}
    if not with_data:
        return body
    body["data"] = (segment.text or "") if segment.kind == TEXT else media_data(segment)
    return body


#: A streamed media event is yielded in pieces this long (together, the same bytes): the loop
#: encodes and copies each piece as one step, never megabytes at once.
EVENT_PIECE = 1024 * 1024


def _in_pieces(encode: Callable[[], str]) -> list[str]:
    text = encode()
    return [text[at:at + EVENT_PIECE] for at in range(0, len(text), EVENT_PIECE)] or [text]


async def encoded(segment: Segment, encode: Callable[[], str]) -> list[str]:
    """``encode()`` in pieces of at most :data:`EVENT_PIECE` characters, made on a worker
    thread when the segment carries media."""
    if segment.media is None:
        return [encode()]
    return await asyncio.to_thread(_in_pieces, encode)


Events = AsyncIterator[Segment | Complete] | AsyncIterator[Segment | Complete | Progress]


def generate_sse(events: Events, rid: str | None = None) -> AsyncIterator[str]:
    """``event: segment`` per segment, ``event: complete`` with references, then ``[DONE]``;
    a failure (any exception) sends ``event: error`` instead of ``complete``."""
    return ends_with_done(_generate_events(events), ERROR_EVENT, rid)


async def _generate_events(events: Events) -> AsyncGenerator[str, None]:
    async for event in events:
        if isinstance(event, Progress):
            yield sse_event("progress", event.wire())
        elif isinstance(event, Segment):
            note_segment()
            for piece in await encoded(event, partial(_segment_event, event)):
                yield piece
        else:
            yield sse_event("complete", {
                "execution_id": event.segments[0].execution_id if event.segments else None,
                "finish_reason": event.finish_reason,
                "segments": [segment_wire(s, with_data=False) for s in event.segments],
                "usage": event.usage,
            })


async def collect(events: Events) -> Complete:
    async for event in events:
        if isinstance(event, Segment):
            note_segment()
        elif isinstance(event, Complete):
            return event
    raise RuntimeError("the interleaved run ended without completing")


def generate_json(rid: str, done: Complete) -> dict[str, Any]:
    return {"execution_id": rid, "text": joined_text(done.segments),
            "segments": [segment_wire(s) for s in done.segments],
            "finish_reason": done.finish_reason, "usage": done.usage}


def chat_json(rid: str, model: str, done: Complete) -> dict[str, Any]:
    return completion_body(rid, model, joined_text(done.segments), done.finish_reason,
                           chat_usage(done.usage),
                           segments=[segment_wire(s) for s in done.segments])


def chat_sse(rid: str, model: str, include_usage: bool,
             events: Events) -> AsyncIterator[str]:
    """Chat chunks: each segment as ``delta.segment`` (text also as ``delta.content``); a
    failure (any exception) sends ``{"error": ...}`` before ``[DONE]``."""
    return ends_with_done(_chat_chunks(rid, model, include_usage, events), ERROR_DATA, rid)


async def _chat_chunks(rid: str, model: str, include_usage: bool,
                       events: Events) -> AsyncGenerator[str, None]:
    yield sse_data(chunk_body(rid, model, {"role": "assistant", "content": ""}))
    async for event in events:
        if isinstance(event, Progress):
            yield sse_data(chunk_body(rid, model, {"progress": event.wire()}))
        elif isinstance(event, Segment):
            note_segment()
            for piece in await encoded(event, partial(_segment_chunk, rid, model, event)):
                yield piece
        else:
            usage = chat_usage(event.usage) if include_usage else None
            yield sse_data(chunk_body(rid, model, {}, event.finish_reason, usage))


def _segment_delta(segment: Segment) -> dict[str, Any]:
    delta: dict[str, Any] = {"segment": segment_wire(segment)}
    if segment.kind == TEXT:
        delta["content"] = segment.text
    return delta
