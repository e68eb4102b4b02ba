"""A stale, duplicated or forged stage message never advances a request: ``StageHandle`` accepts
a message only for the pending call of its rid with that call's dispatch token."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import ServerError, StageCallError
from sglang_omni.runtime.stage.handle import StageHandle


def handle() -> StageHandle:
    spec = EngineSpec(stage="generation", role="generation", backend="scripted",
                      model_path=None, gpu=None, gpu_memory_fraction=None, factory={},
                      engine={})
    h = StageHandle(spec, startup_timeout_s=1.0)
    h.ready = True  # no process: what the handle sends goes nowhere, messages are fed by hand
    return h


def run(scenario: Callable[[StageHandle], Awaitable[None]]) -> StageHandle:
    h = handle()

    async def main() -> None:
        await scenario(h)

    asyncio.run(main())
    return h


async def start_call(h: StageHandle, rid: str, **kw: Any) -> tuple[asyncio.Task, int]:
    task = asyncio.create_task(h.call(rid, {"prompt": "x"}, **kw))
    for _ in range(10):
        await asyncio.sleep(0)
        if rid in h.calls.pending:
            return task, h.calls.pending[rid].token
    raise AssertionError("the call was not registered")


def result(rid: Any, token: Any, text: str) -> dict[str, Any]:
    return {"op": "result", "rid": rid, "token": token, "payload": {"text": text}}


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("forged", [
    result("r1", "WRONG", "forged"),       # a token the call never had
    result("r1", None, "forged"),          # no token at all
    result("r2", "SAME", "forged"),        # another request's id with this call's token
    result(None, "SAME", "forged"),        # no request id
    result(["r1"], "SAME", "forged"),      # not a request id
    {"op": "error", "rid": "r1", "token": "WRONG", "status": 500, "message": "forged"},
    {"op": "chunk", "rid": "r1", "token": "WRONG", "data": {"step": 1}},
])
def test_forged_message_is_dropped_and_the_call_waits(forged: dict) -> None:
    chunks: list[dict] = []

    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1", on_chunk=chunks.append)
        message = {k: (token + 1 if v == "WRONG" else token if v == "SAME" else v)
                   for k, v in forged.items()}
        h._on_message(message, [])
        await settle()
        assert not task.done()
        assert h.counters.dropped == 1
        h._on_message(result("r1", token, "real"), [b"bytes"])
        got = await task
        assert isinstance(got, StageResult)
        assert (got.payload, got.frames) == ({"text": "real"}, [b"bytes"])

    h = run(scenario)
    assert chunks == []
    assert (h.counters.dropped, h.counters.completed, h.counters.failed) == (1, 1, 0)


def test_duplicate_result_after_completion_is_dropped() -> None:
    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        h._on_message(result("r1", token, "first"), [])
        assert (await task).payload == {"text": "first"}
        h._on_message(result("r1", token, "again"), [])
        h._on_message({"op": "error", "rid": "r1", "token": token, "status": 500,
                       "message": "late"}, [])
        assert "r1" not in h.calls.pending

    h = run(scenario)
    assert (h.counters.completed, h.counters.failed, h.counters.dropped) == (1, 0, 2)


def test_stale_result_of_an_earlier_dispatch_does_not_answer_the_next_one() -> None:
    async def scenario(h: StageHandle) -> None:
        first, old = await start_call(h, "r1")
        h._on_message(result("r1", old, "turn 1"), [])
        assert (await first).payload == {"text": "turn 1"}
        second, new = await start_call(h, "r1")
        assert new != old
        h._on_message(result("r1", old, "turn 1 again"), [])
        await settle()
        assert not second.done()
        h._on_message(result("r1", new, "turn 2"), [])
        assert (await second).payload == {"text": "turn 2"}

    h = run(scenario)
    assert (h.counters.completed, h.counters.dropped) == (2, 1)


def test_result_of_an_aborted_call_is_dropped() -> None:
    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        h._on_message(result("r1", token, "too late"), [])
        assert "r1" not in h.calls.pending

    h = run(scenario)
    assert (h.counters.completed, h.counters.dropped) == (0, 1)


def test_matching_error_fails_the_call_once() -> None:
    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        h._on_message({"op": "error", "rid": "r1", "token": token, "status": 400,
                       "type": "invalid_request_error", "message": "bad option"}, [])
        with pytest.raises(StageCallError) as info:
            await task
        assert (info.value.status, info.value.message) == (400, "bad option")
        h._on_message(result("r1", token, "after the error"), [])

    h = run(scenario)
    assert (h.counters.failed, h.counters.completed, h.counters.dropped) == (1, 0, 1)


def test_chunks_with_the_right_token_reach_the_call_in_order() -> None:
    chunks: list[dict] = []

    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1", on_chunk=chunks.append)
        for step in (1, 2):
            h._on_message({"op": "chunk", "rid": "r1", "token": token, "data": {"step": step}},
                          [])
        h._on_message({"op": "chunk", "rid": "r1", "token": token + 1, "data": {"step": 99}},
                      [])
        h._on_message(result("r1", token, "done"), [])
        await task

    h = run(scenario)
    assert chunks == [{"step": 1}, {"step": 2}]
    assert h.counters.dropped == 1


def test_open_jobs_are_the_jobs_the_stage_holds() -> None:
    """What a replica reports as its stages' jobs (``stage_jobs``, the router's load where no
    planner quotes): a dropped late message neither hides a job in flight nor counts one."""

    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        assert h.open_jobs == 1
        h._on_message(result("r1", token + 1, "stale"), [])  # dropped
        await settle()
        assert h.counters.dropped == 1 and h.open_jobs == 1
        h._on_message(result("r1", token, "real"), [])
        await task
        assert h.open_jobs == 0
        await start_call(h, "r2")
        h.dead = True  # its process is gone: it holds nothing
        assert h.open_jobs == 0

    run(scenario)


@pytest.mark.parametrize(("bad", "field"), [
    ({"payload": ["not", "a", "map"]}, "result.payload: expected a map, got list"),
    ({"engine_s": "fast"}, "result.engine_s: expected a number, got str"),
])
def test_a_malformed_answer_for_the_call_fails_it_naming_the_field(bad: dict, field: str
                                                                   ) -> None:
    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        h._on_message({**result("r1", token, "x"), **bad}, [])
        with pytest.raises(ServerError) as caught:
            await task
        assert f"stage protocol error: {field}" in caught.value.message
        assert (h.counters.failed, h.counters.dropped) == (1, 0)
        assert not h.calls.open  # a result ends its job on the stage

    run(scenario)


def test_an_unknown_message_type_is_dropped_even_naming_the_call() -> None:
    async def scenario(h: StageHandle) -> None:
        task, token = await start_call(h, "r1")
        h._on_message({"op": "added-later", "rid": "r1", "token": token}, [])
        await settle()
        assert not task.done() and h.counters.dropped == 1
        h._on_message(result("r1", token, "real"), [])
        assert (await task).payload == {"text": "real"}

    run(scenario)
