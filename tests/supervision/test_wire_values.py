"""Values the stage wire (msgpack) cannot carry fail their call at once, never after a timeout:
refused in ``StageHandle.call`` before anything is sent, and a stage result that cannot be
packed answers an error instead of vanishing."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.errors import BadRequest, StageCallError
from sglang_omni.media.inline import InlinePayload
from sglang_omni.runtime.stage.handle import StageHandle

QUICK_S = 10.0  # generous: the calls fail in milliseconds; before the fix they never returned


def reasoner() -> StageHandle:
    spec = EngineSpec(stage="reasoner", role="reasoner", backend="scripted", model_path=None,
                      gpu=None, gpu_memory_fraction=None, factory={},
                      engine={"skip_server_warmup": True})
    return StageHandle(spec, startup_timeout_s=60.0, log_level="warning")


def with_stage(scenario: Callable[[StageHandle], Awaitable[None]]) -> None:
    async def main() -> None:
        handle = reasoner()
        await handle.start()
        try:
            await scenario(handle)
        finally:
            await handle.stop()

    asyncio.run(main())


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "turn_index": 0, **extra}


@pytest.mark.parametrize(("payload", "field"), [
    (chat("hi", sampling={"seed": 2**64}), "sampling.seed"),
    (chat("hi", sampling={"seed": -(2**63) - 1}), "sampling.seed"),
    (chat("\ud800"), "messages[0].content"),
    ({**chat("hi"), "stage_params": {"x": 2**64}}, "stage_params.x"),
])
def test_unencodable_payload_fails_the_call_at_once(payload: dict, field: str) -> None:
    async def scenario(handle: StageHandle) -> None:
        with pytest.raises(BadRequest) as caught:
            await asyncio.wait_for(handle.call("r1", payload), QUICK_S)
        assert caught.value.message.startswith(f"{field}: ")
        assert "cannot be carried" in caught.value.message
        # nothing is left pending, and the stage still serves
        assert not handle.calls.pending
        result = await asyncio.wait_for(handle.call("r2", chat("hello")), QUICK_S)
        assert "hello" in result.payload["text"]

    with_stage(scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_result_the_wire_cannot_carry_fails_the_request(stream: bool) -> None:
    # The script's JSON escape becomes a lone surrogate only inside the stage, in its answer.
    lone = '<omni-script>["bad \\ud800 text"]</omni-script>'

    async def scenario(handle: StageHandle) -> None:
        with pytest.raises(StageCallError) as caught:
            await asyncio.wait_for(handle.call("r1", chat(lone, stream=stream),
                                               on_chunk=lambda _: None), QUICK_S)
        assert caught.value.status == 500
        result = await asyncio.wait_for(handle.call("r2", chat("hello")), QUICK_S)
        assert "hello" in result.payload["text"]

    with_stage(scenario)


def test_a_garbled_base64_frame_fails_its_call_and_the_stage_serves_on() -> None:
    """A client's inline medium crosses as base64 text that the stage decodes as it arrives
    (the server checked it where it entered); one that does not decode fails its request with
    an error naming it, at once, and the stage serves the next (issue 33, item 4)."""
    bad = InlinePayload("QUJD" * 300_000 + "QU!=", None)  # the last window does not decode
    good = InlinePayload(base64.b64encode(b"the client's bytes").decode(), None)
    media = {"keys": ["c0"], "new": ["c0"]}

    async def scenario(handle: StageHandle) -> None:
        with pytest.raises(StageCallError) as caught:
            await asyncio.wait_for(handle.call("r1", chat("hi"), [bad], media=media), QUICK_S)
        assert caught.value.status == 500
        assert "garbled" in caught.value.message and "not strict base64" in caught.value.message
        handle.end_request("r1")
        result = await asyncio.wait_for(handle.call("r2", chat("hello"), [good], media=media),
                                        QUICK_S)
        assert "hello" in result.payload["text"]

    with_stage(scenario)
