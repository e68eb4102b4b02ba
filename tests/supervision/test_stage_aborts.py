"""Where an aborted job stopped is in the stage's log, however early the abort came; a job is
reported ``started`` only once its engine has it.

An abort can reach a generation stage before its engine ran any of the job: in the same read as
the job's submit (a client that left at once, on a loaded host), or while the job waited for
the GPU behind an older request's. The engine then logs nothing (it never had the job), so the
stage's ``aborted`` line says so; a job the engine had is logged by the engine (the scripted
one: ``generation cancelled at step N of M``). The stage here is the real stage server on an
event loop the test drives, its channel's far end held by the test."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.contract.messages import Abort, Submit
from sglang_omni.engines.base import build_engine
from sglang_omni.runtime.ipc import Channel, channel_pair
from sglang_omni.runtime.stage.process import _StageServer

STEPS = 50
SPEC = EngineSpec(stage="generation", role="generation", backend="scripted", model_path=None,
                  gpu=None, gpu_memory_fraction=None, factory={"step_time_s": 0.2}, engine={})


def submit(rid: str, order: float, steps: int = STEPS) -> Submit:
    return Submit(rid, 1, {"modality": "image", "prompt": "a slow cube",
                           "options": {"width": 32, "height": 32,
                                       "num_inference_steps": steps}}, order=order)


def on_a_stage(scenario: Callable[[_StageServer], Awaitable[None]]) -> list[str]:
    """Run ``scenario`` against a scripted generation stage server; the ops it sent."""
    ours, theirs = channel_pair()
    server_end = Channel(ours)

    async def main() -> None:
        stage = _StageServer(SPEC, Channel(theirs))
        stage.engine = build_engine(SPEC)
        await stage.engine.start()
        try:
            await scenario(stage)
            await asyncio.gather(*(task for _, task, _ in stage.jobs.values()),
                                 return_exceptions=True)
        finally:
            stage.sender.shutdown(wait=True)
            stage.channel.close()

    try:
        asyncio.run(main())
        sent: list[str] = []
        while True:  # what the stage sent, up to its closed end
            try:
                sent.append(server_end.recv()[0]["op"])
            except EOFError:
                return sent
    finally:
        server_end.close()


async def ended(stage: _StageServer, rid: str) -> None:
    entry = stage.jobs.get(rid)
    if entry is not None:
        await asyncio.gather(entry[1], return_exceptions=True)


def test_an_abort_that_arrives_with_its_submit_is_logged_as_before_the_engine(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(stage: _StageServer) -> None:
        stage._handle(submit("left-at-once", 1.0), [])  # the reader hands both over in one go
        stage._handle(Abort("left-at-once"), [])
        await ended(stage, "left-at-once")

    with caplog.at_level(logging.INFO, logger="sglang_omni"):
        sent = on_a_stage(scenario)
    assert "aborted" in sent and "result" not in sent and "started" not in sent
    assert "request left-at-once aborted before its engine began it" in caplog.text
    assert "generation cancelled at step" not in caplog.text


def test_an_abort_while_waiting_for_the_gpu_says_so_and_the_running_job_its_step(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(stage: _StageServer) -> None:
        stage._handle(submit("older", 1.0), [])
        await asyncio.sleep(0)  # the older job's task takes the free GPU
        assert stage.jobs["older"][0].began
        stage._handle(submit("younger", 2.0), [])
        await asyncio.sleep(0)  # the younger job's task waits for the GPU
        assert not stage.jobs["younger"][0].began
        stage._handle(Abort("younger"), [])
        await ended(stage, "younger")
        stage._handle(Abort("older"), [])
        await ended(stage, "older")

    with caplog.at_level(logging.INFO, logger="sglang_omni"):
        sent = on_a_stage(scenario)
    assert sent.count("aborted") == 2 and "result" not in sent
    assert sent.count("started") == 1  # the older job's: the younger never began
    assert "request younger aborted before its engine began it (it waited" in caplog.text
    assert "request younger: generation cancelled" not in caplog.text
    assert "request older: generation cancelled at step 0 of 50" in caplog.text
    assert re.search(r"request older aborted$", caplog.text, re.MULTILINE)


def test_a_job_is_reported_started_once_its_engine_takes_it() -> None:
    """``started`` tells the server the engine took the job (``sgl_omni_stage_jobs_total``):
    a generation job waiting for its GPU turn behind an older one is not started yet."""
    async def scenario(stage: _StageServer) -> None:
        stage._handle(submit("older", 1.0, steps=2), [])
        stage._handle(submit("younger", 2.0, steps=2), [])
        await ended(stage, "older")
        await ended(stage, "younger")

    jobs = [op for op in on_a_stage(scenario) if op in ("started", "result")]
    assert jobs == ["started", "result", "started", "result"]
