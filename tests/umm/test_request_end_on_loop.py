"""A streaming request's end (admission, planner slot, request id) is handled on the event
loop's thread: Starlette runs a sync background function in a worker thread, where touching the
planner's events raced with the loop and could leave another request waiting forever."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx

from sglang_omni.config import load_config
from sglang_omni.serve.app import create_app
from tests.umm.kit import final, image, script

CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"
BODY = {"prompt": script(image("a cube"), final("done")), "stream": True,
        "stage_params": {"generation": {"width": 32, "height": 32}}}


async def _threads_that_ended_runs() -> tuple[set[str], set[str]]:
    app = create_app(load_config(CONFIG, visible_gpus=0))
    orchestrator = app.state.orchestrator
    ended: list[str] = []
    end = orchestrator.end_interleaved

    def recording_end(run: object) -> None:
        ended.append(threading.current_thread().name)
        end(run)

    orchestrator.end_interleaved = recording_end
    await orchestrator.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://omni") as client:
            resp = await client.post("/generate", json=BODY, timeout=30)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n"), resp.text
        assert orchestrator.active == set()
        return set(ended), {threading.current_thread().name}
    finally:
        await orchestrator.stop()


def test_a_streaming_request_ends_on_the_event_loop_thread() -> None:
    ended, loop_thread = asyncio.run(_threads_that_ended_runs())
    assert ended == loop_thread
