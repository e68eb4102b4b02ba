"""One ``/generate`` walks the shapes docs/interleaved.md lists ("One walk"), each once: the
body's set fields are read once (by the parser and the media check alike), the parser's
ChatRequest is the controller's UMMRequest (no copy of its fields), and each Reasoner turn's
payload is built once, by the adapter, and packed into the stage message as it is (its media
parts pointed at the turn's frames).
Driven in-process over ASGI with the scripted engines, spying on each step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_omni.config import load_config
from sglang_omni.pipeline import reasoner_media, umm
from sglang_omni.pipeline.chat_request import ChatRequest
from sglang_omni.runtime.stage import handle as stage_handle
from sglang_omni.serve.app import create_app
from sglang_omni.serve.chat import interleaved_routes
from tests.umm.kit import final, image, script

CONFIG = Path(__file__).parents[2] / "configs" / "cpu-scripted.yaml"
BODY = {"prompt": script(image("a cube"), final("done")), "stream": False,
        "stage_params": {"generation": {"width": 32, "height": 32}}}


async def _walk(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[Any]]:
    walk: list[str] = []
    made: list[Any] = []
    set_fields, init = interleaved_routes.set_fields, ChatRequest.__init__
    open_run, prepare = umm.UMMController.open, reasoner_media.ReasonerMedia.prepare
    pack = stage_handle.pack_message

    def spy_fields(body: Any) -> dict[str, Any]:
        walk.append("set fields")
        return set_fields(body)

    def spy_init(self: ChatRequest, *args: Any, **kwargs: Any) -> None:
        walk.append("ChatRequest")
        made.append(self)
        init(self, *args, **kwargs)

    def spy_open(self: umm.UMMController, request: Any) -> umm.UMMRun:
        walk.append("UMMRequest is the ChatRequest" if any(request is m for m in made)
                    else "UMMRequest copied")
        return open_run(self, request)

    async def spy_prepare(self: Any, handle: Any, payload: Any, frames: Any) -> Any:
        walk.append("ReasonerPayload")
        made.append(payload)
        return await prepare(self, handle, payload, frames)

    def spy_pack(message: Any, frames: Any) -> Any:
        sent = message.payload  # a typed Submit (contract.messages)
        kind = sent.get("modality", "reasoner")
        if kind == "reasoner":  # the payload the adapter built, not a copy of it
            kind += " (the adapter's payload)" if sent is made[-1] else " (a copy)"
        walk.append(f"msgpack {kind}")
        return pack(message, frames)

    monkeypatch.setattr(interleaved_routes, "set_fields", spy_fields)
    monkeypatch.setattr(ChatRequest, "__init__", spy_init)
    monkeypatch.setattr(umm.UMMController, "open", spy_open)
    monkeypatch.setattr(reasoner_media.ReasonerMedia, "prepare", spy_prepare)
    monkeypatch.setattr(stage_handle, "pack_message", spy_pack)
    app = create_app(load_config(CONFIG, visible_gpus=0))
    orchestrator = app.state.orchestrator
    await orchestrator.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://omni") as client:
            resp = await client.post("/generate", json=BODY, timeout=60)
        assert resp.status_code == 200, resp.text
        return walk, resp.json()["segments"]
    finally:
        await orchestrator.stop()


def test_one_generate_walks_each_shape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    walk, segments = asyncio.run(_walk(monkeypatch))
    assert [s["kind"] for s in segments] == ["image", "text"]
    assert walk == ["set fields", "ChatRequest", "UMMRequest is the ChatRequest",
                    # the first decision, the generation, the final answer
                    "ReasonerPayload", "msgpack reasoner (the adapter's payload)",
                    "msgpack image",
                    "ReasonerPayload", "msgpack reasoner (the adapter's payload)"]
