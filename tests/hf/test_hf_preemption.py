"""A generation paused at a denoising step boundary for an older request's, on the tiny checkpoint
on the CPU (the hf engine's fast loop, as on a GPU), resumes where it stopped: its output bytes
equal those of the same job run alone, and so do the older job's."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")

from sglang_omni.contract.gpu_turns import GpuTurns  # noqa: E402
from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFGenerator  # noqa: E402

STEPS = 4
PAUSE_AT = 2


def payload(prompt: str, seed: int, modality: str = "image") -> dict[str, Any]:
    options = {"width": 64, "height": 64, "num_inference_steps": STEPS, "seed": seed}
    if modality == "video":
        options.update(num_frames=9, fps=8)
    return {"modality": modality, "prompt": prompt, "options": options}


async def on_stage(engine: HFGenerator, job: Job) -> Any:
    """Run ``job`` as the stage does: within its GPU turn."""
    assert job.turn is not None
    await job.turn.begin()
    try:
        return await engine.run(job)
    finally:
        job.turn.end()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Any:
    spec = EngineSpec(stage="generation", role="generation", backend="hf",
                      model_path=str(tiny_checkpoint), gpu=None, gpu_memory_fraction=None,
                      factory={}, engine={"denoiser": "fast"})
    hf = HFGenerator(spec)
    asyncio.run(hf.start())
    yield hf
    asyncio.run(hf.close())


def alone(engine: HFGenerator, body: dict[str, Any]) -> bytes:
    result = asyncio.run(engine.run(Job("alone", body, [], emit=lambda _: None)))
    return bytes(result.frames[0])


@pytest.mark.parametrize("modality", ["image", "video"])
def test_a_job_paused_by_an_older_one_gives_the_bytes_it_gives_alone(
        engine: HFGenerator, modality: str) -> None:
    young_body, old_body = payload("a red cube", 7, modality), payload("a blue ball", 11)
    young_alone, old_alone = alone(engine, young_body), alone(engine, old_body)

    async def scenario() -> tuple[bytes, bytes, list[str], int]:
        loop = asyncio.get_running_loop()
        turns = GpuTurns(budget_bytes=1 << 30)
        ended: list[str] = []
        older_waits = threading.Event()

        def young_emit(chunk: dict[str, Any]) -> None:  # on the model thread, after a step
            if chunk.get("step") == PAUSE_AT:
                loop.call_soon_threadsafe(lambda: loop.create_task(start_older()))
                older_waits.wait(30)  # the older job waits for the GPU before this boundary

        young = Job("young", young_body, [], emit=young_emit)
        young.turn = turns.turn("young", 2.0, young.cancelled, young.progress)
        old = Job("old", old_body, [], emit=lambda _: None)
        old.turn = turns.turn("old", 1.0, old.cancelled, old.progress)
        old_done: asyncio.Future[Any] = loop.create_future()

        async def start_older() -> None:
            task = loop.create_task(on_stage(engine, old))
            await asyncio.sleep(0)  # its turn has joined the waiting
            older_waits.set()
            try:
                old_done.set_result(await task)
            finally:
                ended.append("old")

        young_result = await on_stage(engine, young)
        ended.append("young")
        old_result = await old_done
        assert young.turn is not None
        return (bytes(young_result.frames[0]), bytes(old_result.frames[0]), ended,
                young.turn.pauses)

    young_bytes, old_bytes, ended, pauses = asyncio.run(scenario())
    assert pauses == 1
    assert ended == ["old", "young"]  # the older job ran while the younger was paused
    assert young_bytes == young_alone
    assert old_bytes == old_alone
