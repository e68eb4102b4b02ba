"""Every SSE stream ends with an error event and ``[DONE]`` whatever is raised, usage tolerates
what an adapter leaves out, and keep-alive comments flow while a stream has nothing to send."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest
from sglang_omni.pipeline.umm import Complete, Segment
from sglang_omni.serve.chat.chat_request import parse_chat_request
from sglang_omni.serve.chat.chat_routes import _text_chat_sse
from sglang_omni.serve.wire.sse import SSE_DONE, SSE_KEEPALIVE, with_keepalive
from sglang_omni.serve.wire.umm_wire import chat_sse, generate_sse
from tests.umm_contract.test_toy_adapter import toy_adapter

SECRET = "/srv/internal/path Unable to allocate 27.9 GiB"


async def drain(stream: AsyncIterator[str]) -> list[str]:
    return [item async for item in stream]


async def events_then(items: list[Any], exc: BaseException | None = None
                      ) -> AsyncIterator[Segment | Complete]:
    for item in items:
        yield item
    if exc is not None:
        raise exc


def data_of(chunk: str) -> Any:
    line = next(ln for ln in chunk.splitlines() if ln.startswith("data: "))
    return json.loads(line[6:])


def test_chat_stream_usage_of_the_documented_toy_adapter() -> None:
    adapter = toy_adapter()()
    adapter.tokens = 7  # what the toy adapter counts; its usage() has no prompt/total tokens
    text = Segment("r1", 0, "text", text="a red cube")
    done = Complete("stop", (text,), adapter.usage())
    chunks = asyncio.run(drain(chat_sse("r1", "m", True, events_then([text, done]))))
    assert chunks[-1] == SSE_DONE
    final = data_of(chunks[-2])
    assert "error" not in final
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"] == {"completion_tokens": 7}


def test_chat_stream_ends_with_a_generic_error_on_any_exception() -> None:
    text = Segment("r2", 0, "text", text="hi")
    chunks = asyncio.run(drain(chat_sse("r2", "m", False,
                                        events_then([text], RuntimeError(SECRET)))))
    assert chunks[-1] == SSE_DONE
    error = data_of(chunks[-2])["error"]
    assert error["code"] == 500 and error["type"] == "server_error"
    assert "Unable to allocate" not in "".join(chunks)


def test_generate_stream_ends_with_an_error_event_on_any_exception() -> None:
    chunks = asyncio.run(drain(generate_sse(events_then([], KeyError(SECRET)), "r3")))
    assert chunks[-1] == SSE_DONE and chunks[-2].startswith("event: error\n")
    assert data_of(chunks[-2])["code"] == 500 and "allocate" not in chunks[-2]
    chunks = asyncio.run(drain(generate_sse(events_then([], BadRequest("x: wrong")), "r4")))
    assert data_of(chunks[-2]) == {"message": "x: wrong", "type": "invalid_request_error",
                                   "code": 400}


def test_text_chat_stream_ends_with_error_and_done_on_any_exception() -> None:
    req = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "stream_options": {"include_usage": True}},
                             known_stages=("reasoner",))

    async def stage_stream() -> AsyncIterator[Any]:
        yield {"text": "hel"}
        raise ZeroDivisionError(SECRET)

    chunks = asyncio.run(drain(_text_chat_sse("r5", "m", req, {"text": ""}, stage_stream())))
    assert chunks[-1] == SSE_DONE and data_of(chunks[-2])["error"]["code"] == 500
    assert "allocate" not in "".join(chunks)

    async def finished() -> AsyncIterator[Any]:
        yield StageResult({"text": "x", "finish_reason": "stop", "usage": {}}, [], 0.0)

    chunks = asyncio.run(drain(_text_chat_sse("r6", "m", req, {"text": ""}, finished())))
    assert chunks[-1] == SSE_DONE and "error" not in chunks[-2]


def test_keepalive_comments_while_nothing_is_sent_and_closing_leaves_no_task() -> None:
    closed: list[str] = []

    async def slow() -> AsyncIterator[str]:
        try:
            yield "data: 1\n\n"
            await asyncio.sleep(0.5)
            yield "data: 2\n\n"
            await asyncio.sleep(60)  # a generation that never ends
            yield "data: never\n\n"
        finally:
            closed.append("inner")

    async def main() -> tuple[list[str], int]:
        out: list[str] = []
        stream = with_keepalive(slow(), 0.05)
        async for item in stream:
            out.append(item)
            if "data: 2\n\n" in out and out[out.index("data: 2\n\n"):].count(SSE_KEEPALIVE) > 1:
                break  # inside the endless wait: a read of the inner stream is pending
        await stream.aclose()  # the client went away mid-generation
        await asyncio.sleep(0)
        return out, len(asyncio.all_tasks()) - 1

    out, leftover = asyncio.run(main())
    assert out[0] == "data: 1\n\n" and "data: 2\n\n" in out
    assert SSE_KEEPALIVE in out[1:out.index("data: 2\n\n")]  # sent during the 0.5 s wait
    assert closed == ["inner"] and leftover == 0


def test_keepalive_off_passes_the_stream_through() -> None:
    async def quick() -> AsyncIterator[str]:
        yield "a"
        await asyncio.sleep(0.2)
        yield "b"

    assert asyncio.run(drain(with_keepalive(quick(), 0))) == ["a", "b"]
