"""A large accepted body is held about once in the server for the whole request, not only while
it is read (issue 33, item 4: a 150 MB body of three inline media peaked at 2.08x its size, since
the Reasoner's first turn decoded every client medium to bytes beside the request's text, and
the PNG check read a medium's largest chunk whole, twice over).

The server's path from the parsed body to the Reasoner stage's message is run in this process,
as the routes run it (validation, the media checks at admission, the history's size, the
adapter's first turn, the turn's media, the packed message and every buffer the stage link
would write), and its allocations traced (tracemalloc: exact, the same on every run): beyond
the body's own value they stay under half the body, so the request peaks under 1.5x its size
(what the body readers add is ``tests/wire/test_body_memory.py``'s). That the stage still reads
the client's exact bytes is ``tests/umm/test_request_media.py``'s."""

from __future__ import annotations

import asyncio
import base64
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from sglang_omni.media import check_chat_request
from sglang_omni.media.admission import admit_media
from sglang_omni.media.settings import policy_from_spec
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter
from sglang_omni.pipeline.reasoner_media import ReasonerMedia
from sglang_omni.pipeline.umm import Limits, UMMController, UMMRequest, history_bytes
from sglang_omni.runtime.ipc import pack_message, wire_pieces
from sglang_omni.serve.chat.chat_request import parse_chat_request, set_fields
from sglang_omni.serve.chat.generate_request import parse_generate_request
from sglang_omni.serve.schemas.chat import ChatCompletionRequest, GenerateRequest
from tests.media.padded import padded_mp4, padded_png

MB = 10**6
STAGES = ("generation", "reasoner")
#: The body's size; its media are a few MB each, far above the fixed costs traced beside them.
BODY = 24 * MB


class _Handle:
    """What ReasonerMedia reads of a stage handle."""

    name = "reasoner"
    process_generation = 1


def urls(kind: str, parts: int, body: int) -> list[str]:
    make, mime = (padded_png, "image/png") if kind == "image" else (padded_mp4, "video/mp4")
    size = body // parts * 3 // 4
    return [f"data:{mime};base64,{base64.b64encode(make(size, seed)).decode()}"
            for seed in range(parts)]


def body_of(route: str, kind: str, parts: int, body: int = BODY) -> dict[str, Any]:
    """The parsed JSON body of ``route`` (about ``body`` bytes) carrying ``parts`` inline
    media of ``kind``."""
    media = urls(kind, parts, body)
    if route == "/generate":
        return {"prompt": "describe", f"{kind}s": media}
    part = f"{kind}_url"
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"},
        *({"type": part, part: {"url": url}} for url in media)]}], "max_tokens": 8}


async def to_the_stage(route: str, value: dict[str, Any]) -> int:
    """Run the server's path for the parsed body ``value`` up to the Reasoner stage's message;
    the bytes it would write to the stage."""
    policy = policy_from_spec({})
    if route == "/generate":
        body: Any = GenerateRequest.model_validate(value)
        req = parse_generate_request(body, STAGES)
    else:
        body = ChatCompletionRequest.model_validate(value)
        req = parse_chat_request(body, known_stages=STAGES)
    await admit_media(check_chat_request(set_fields(body), policy), policy)
    size = await asyncio.to_thread(history_bytes, req.messages)
    controller = UMMController(Cosmos3UMMAdapter, Limits(max_retained_bytes=2**30),
                               call=None)  # type: ignore[arg-type]
    run = controller.open(UMMRequest(rid="r1", messages=req.messages, sampling=req.sampling,
                                     stage_params=req.stage_params, media_policy=policy,
                                     history_size=size))
    dispatch = run.first.dispatch
    assert dispatch is not None and dispatch.stage == "reasoner"
    media = ReasonerMedia("r1", policy)
    try:
        turn = await media.prepare(_Handle(), dispatch.payload,  # type: ignore[arg-type]
                                   dispatch.frames)
        packed = pack_message({"op": "submit", "rid": "r1", "token": 1,
                               "payload": turn.payload, "media": turn.media}, turn.frames)
        sent = 0
        for piece in wire_pieces(packed, turn.frames):  # as the stage link writes them
            sent += len(piece)
            del piece
        return sent
    finally:
        media.close()
        run.close()


def traced_peak(work: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    """Run the path once on a small body first: what its first run imports is not traced."""
    for route in ("/generate", "/v1/chat/completions"):
        for kind in ("image", "video"):
            asyncio.run(to_the_stage(route, body_of(route, kind, 1, body=30_000)))


@pytest.mark.parametrize(("route", "kind", "parts"), [
    ("/generate", "image", 3), ("/generate", "video", 3),
    ("/v1/chat/completions", "image", 3), ("/v1/chat/completions", "video", 3),
    ("/generate", "image", 1), ("/v1/chat/completions", "video", 1)])
def test_the_path_to_the_stage_holds_the_body_about_once(route: str, kind: str,
                                                         parts: int) -> None:
    value = body_of(route, kind, parts)
    size = len(json.dumps(value))
    sent: list[int] = []
    peak = traced_peak(lambda: sent.append(asyncio.run(to_the_stage(route, value))))
    assert peak < 0.5 * size, f"{route} {kind} x{parts}: {1 + peak / size:.2f}x the body"
    assert sent[0] >= size - 1000  # the media went as the client's base64
