"""Wire forms of interleaved results: ``/generate`` SSE and JSON, and chat segments."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sglang_omni.errors import OmniError
from sglang_omni.pipeline.umm import TEXT, Complete, Segment
from sglang_omni.serve.openai_chat import chunk_body, completion_body
from sglang_omni.serve.sse import SSE_DONE, sse_data, sse_event


def joined_text(segments: tuple[Segment, ...] | list[Segment]) -> str:
    return "".join(s.text or "" for s in segments if s.kind == TEXT)


def error_event(exc: OmniError) -> dict[str, Any]:
    return {"message": exc.message, "type": exc.type, "code": exc.status}


async def generate_sse(events: AsyncIterator[Segment | Complete]) -> AsyncIterator[str]:
    """``event: segment`` per segment, ``event: complete`` with references, then ``[DONE]``;
    a failure sends ``event: error`` instead of ``complete``."""
    try:
        async for event in events:
            if isinstance(event, Segment):
                yield sse_event("segment", event.to_wire())
            else:
                yield sse_event("complete", {
                    "execution_id": event.segments[0].execution_id if event.segments else None,
                    "finish_reason": event.finish_reason,
                    "segments": [s.to_wire(with_data=False) for s in event.segments],
                    "usage": event.usage,
                })
    except OmniError as exc:
        yield sse_event("error", error_event(exc))
    yield SSE_DONE


async def collect(events: AsyncIterator[Segment | Complete]) -> Complete:
    async for event in events:
        if isinstance(event, Complete):
            return event
    raise RuntimeError("the interleaved run ended without completing")


def generate_json(rid: str, done: Complete) -> dict[str, Any]:
    return {"execution_id": rid, "text": joined_text(done.segments),
            "segments": [s.to_wire() for s in done.segments],
            "finish_reason": done.finish_reason, "usage": done.usage}


def chat_json(rid: str, model: str, done: Complete) -> dict[str, Any]:
    usage = {k: done.usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
             if k in done.usage}
    return completion_body(rid, model, joined_text(done.segments), done.finish_reason, usage,
                           segments=[s.to_wire() for s in done.segments])


async def chat_sse(rid: str, model: str, include_usage: bool,
                   events: AsyncIterator[Segment | Complete]) -> AsyncIterator[str]:
    """Chat chunks: each segment as ``delta.segment`` (text also as ``delta.content``)."""
    yield sse_data(chunk_body(rid, model, {"role": "assistant", "content": ""}))
    try:
        async for event in events:
            if isinstance(event, Segment):
                delta: dict[str, Any] = {"segment": event.to_wire()}
                if event.kind == TEXT:
                    delta["content"] = event.text
                yield sse_data(chunk_body(rid, model, delta))
            else:
                usage = {k: event.usage[k] for k in ("prompt_tokens", "completion_tokens",
                                                     "total_tokens")} if include_usage else None
                yield sse_data(chunk_body(rid, model, {}, event.finish_reason, usage))
    except OmniError as exc:
        yield sse_data(exc.to_body())
    yield SSE_DONE
