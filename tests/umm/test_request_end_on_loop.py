"""A streaming request's end (admission, planner slot, request id) is handled on the event
loop's thread: Starlette runs a sync background function in a worker thread, where touching the
planner's events raced with the loop and could leave another request waiting forever."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx

from sglang_omni.config import load_config
from sglang_omni.serve.app import create_app
from tests.umm.kit import final, image, script

CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"
BODY = {"prompt": script(image("a cube"), final("done")), "stream": True,
        "stage_params": {"generation": {"width": 32, "height": 32}}}


async def _threads_that_ended_runs() -> tuple[list[str], set[str]]:
    app = create_app(load_config(CONFIG, visible_gpus=0))
    orchestrator = app.state.orchestrator
    ended: list[str] = []
    release = orchestrator.states._release

    def recording_release(state: Any) -> None:
        ended.append(threading.current_thread().name)
        release(state)

    orchestrator.states._release = recording_release
    await orchestrator.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://omni") as client:
            resp = await client.post("/generate", json=BODY, timeout=30)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n"), resp.text
        assert orchestrator.admitted == 0 and orchestrator.states.live == 0
        return ended, {threading.current_thread().name}
    finally:
        await orchestrator.stop()


def test_a_streaming_request_ends_once_on_the_event_loop_thread() -> None:
    ended, loop_thread = asyncio.run(_threads_that_ended_runs())
    assert len(ended) == 1 and set(ended) == loop_thread
