"""The scripted engines' contract (documented in the README): tests and the quick start rely
on it, so it is checked here exactly."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import time
from typing import Any

import httpx
import pytest
from PIL import Image

from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.engines.scripted import ScriptedGenerator, ScriptedReasoner
from sglang_omni.engines.synth_media import decode_mp4_frames, frame_pixels
from sglang_omni.errors import BadRequest
from tests.server import SCRIPTED_CHAT, Server


def spec(role: str, umm_adapter: Any = None, **factory: object) -> EngineSpec:
    return EngineSpec(stage=role, role=role, backend="scripted", model_path=None, gpu=None,
                      gpu_memory_fraction=None, factory=dict(factory), engine={},
                      umm_adapter=umm_adapter)


def run(engine: object, payload: dict, frames: list[bytes] | None = None) -> tuple:
    chunks: list[dict] = []
    job = Job("r1", payload, frames or [], emit=chunks.append)
    result = asyncio.run(engine.run(job))  # type: ignore[attr-defined]
    return result, chunks


class JsonAdapter:
    """Stands in for an adapter's decision format."""

    @staticmethod
    def render_decision(entry: dict) -> str:
        return "DECISION " + json.dumps(entry, sort_keys=True)


JSON_ADAPTER = JsonAdapter  # the stage's adapter, given at start-up


def reasoner_payload(messages: list, turn: int = 0) -> dict:
    return {"messages": messages, "turn_index": turn}


SCRIPT = ('<omni-script>[{"action": "image", "prompt": "a cube"}, "raw {not json",'
          ' {"action": "final", "text": "saw {media} after {last}"}]</omni-script>')


def test_reasoner_follows_the_script_turn_by_turn() -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    messages = [{"role": "user", "content": [{"type": "text", "text": SCRIPT}]},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": [{"type": "image_url",
                                              "image_url": {"url": "omni-frame://0"}},
                                             {"type": "text", "text": "here it is"}]}]
    engine = ScriptedReasoner(spec("reasoner", JSON_ADAPTER))
    first, _ = run(engine, reasoner_payload(messages, 0), [png])
    assert first.payload["text"] == 'DECISION {"action": "image", "prompt": "a cube"}'
    second, _ = run(engine, reasoner_payload(messages, 1), [png])
    assert second.payload["text"] == "raw {not json"
    third, _ = run(engine, reasoner_payload(messages, 2), [png])
    media = json.dumps([{"kind": "image", "sha256": hashlib.sha256(png).hexdigest()}])
    assert third.payload["text"] == "DECISION " + json.dumps(
        {"action": "final", "text": f"saw {media} after here it is"}, sort_keys=True)
    past, _ = run(engine, reasoner_payload(messages, 3), [png])
    assert "scripted reasoner: no script entry for turn 3" in past.payload["text"]


def test_reasoner_without_script() -> None:
    engine = ScriptedReasoner(spec("reasoner", JSON_ADAPTER))
    chat_engine = ScriptedReasoner(spec("reasoner"))  # text-only chat: no adapter
    msgs = [{"role": "user", "content": "plain question"}]
    umm, _ = run(engine, reasoner_payload(msgs, 0))
    assert "scripted reasoner: no script entry for turn 0" in umm.payload["text"]
    chat, _ = run(chat_engine, reasoner_payload(msgs, 0))
    again, _ = run(chat_engine, reasoner_payload(msgs, 0))
    assert chat.payload["text"] == again.payload["text"]
    assert "plain question" in chat.payload["text"]


def test_reasoner_delay_and_bad_script() -> None:
    engine = ScriptedReasoner(spec("reasoner", JSON_ADAPTER))
    msgs = [{"role": "user", "content": '<omni-script>[{"action": "final", "text": "t", '
                                        '"delay_s": 0.3}]</omni-script>'}]
    start = time.monotonic()
    result, _ = run(engine, reasoner_payload(msgs, 0))
    assert time.monotonic() - start >= 0.3
    assert "delay_s" not in result.payload["text"]
    with pytest.raises(BadRequest):
        run(engine, reasoner_payload([{"role": "user", "content": "<omni-script>{}"
                                       "</omni-script>"}], 0))


def test_generator_image_default_size_and_pixels() -> None:
    result, chunks = run(ScriptedGenerator(spec("generation")),
                         {"modality": "image", "prompt": "red", "options": {"seed": 3}})
    (item,) = result.payload["media"]
    assert item["mime_type"] == "image/png"
    image = Image.open(io.BytesIO(result.frames[item["frame"]])).convert("RGB")
    assert image.size == (640, 640)
    expected = frame_pixels("red", 3, 640, 640, 0)
    assert image.getpixel((10, 20)) == tuple(int(v) for v in expected[20, 10])
    assert [c["step"] for c in chunks] == [1, 2, 3, 4]


def test_generator_video_frames_fps_and_determinism() -> None:
    gen = ScriptedGenerator(spec("generation"))
    payload = {"modality": "video", "prompt": "wave",
               "options": {"width": 64, "height": 48, "num_frames": 9, "fps": 12,
                           "num_inference_steps": 2}}
    result, chunks = run(gen, payload)
    again, _ = run(gen, payload)
    assert result.frames[0] == again.frames[0]
    assert result.payload["media"][0]["mime_type"] == "video/mp4"
    frames = decode_mp4_frames(result.frames[0])
    assert len(frames) == 9 and frames[0].shape == (48, 64, 3)
    assert len(chunks) == 2
    import av
    with av.open(io.BytesIO(result.frames[0])) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        assert container.streams.video[0].average_rate == 12


def test_generator_default_video_is_33_frames_at_24_fps() -> None:
    result, _ = run(ScriptedGenerator(spec("generation")),
                    {"modality": "video", "prompt": "x", "options": {"width": 32, "height": 32}})
    assert len(decode_mp4_frames(result.frames[0])) == 33


@pytest.mark.parametrize(("directive", "check"), [
    ("!no-media", lambda r: r.payload["media"] == [] and "no-media" in r.payload["reason"]),
    ("!oversize", lambda r: len(r.frames[0]) > 8 * 1024 * 1024),
    ("!extra", lambda r: len(r.payload["media"]) == 2),
    ("!malformed", lambda r: not r.frames[0].startswith(b"\x89PNG")),
])
def test_generator_fault_directives(directive: str, check) -> None:  # noqa: ANN001
    result, _ = run(ScriptedGenerator(spec("generation")),
                    {"modality": "image", "prompt": f"{directive} cube",
                     "options": {"width": 32, "height": 32}})
    assert check(result)


def test_generator_steps_take_step_time_and_cancel_within_a_step(
        caplog: pytest.LogCaptureFixture) -> None:
    """Steps take step_time_s; a cancel lands inside the step in progress, not after it: once
    two steps are done the steps become an hour long, and the cancel still ends the job (the
    log naming the step it stopped at), with no further step reported."""
    gen = ScriptedGenerator(spec("generation", step_time_s=0.2))

    async def scenario() -> tuple[float, list[dict]]:
        chunks: list[dict] = []
        two_done = asyncio.Event()

        def emit(chunk: dict) -> None:
            chunks.append(chunk)
            if chunk["step"] == 2:
                gen.step_time_s = 3600.0
                two_done.set()

        job = Job("r", {"modality": "image", "prompt": "p",
                        "options": {"num_inference_steps": 10, "width": 16, "height": 16}},
                  [], emit=emit)
        started = time.monotonic()
        task = asyncio.create_task(gen.run(job))
        await two_done.wait()
        two_steps = time.monotonic() - started
        await asyncio.sleep(0)  # the third step has begun
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)  # a safety net: an uncancelled step is an hour
        return two_steps, chunks

    with caplog.at_level(logging.INFO):
        two_steps, chunks = asyncio.run(scenario())
    assert two_steps >= 0.4  # two steps of 0.2 s
    assert [c["step"] for c in chunks] == [1, 2]
    assert "request r: generation cancelled at step 2 of 10" in caplog.text


def test_sleep_directive() -> None:
    start = time.monotonic()
    run(ScriptedGenerator(spec("generation")),
        {"modality": "image", "prompt": "!sleep=0.4 x", "options": {"width": 16, "height": 16}})
    assert time.monotonic() - start >= 0.4


def test_text_only_chat_through_http() -> None:
    with Server(*SCRIPTED_CHAT) as server:
        body = {"messages": [{"role": "user", "content": "what is up"}]}
        first = httpx.post(f"{server.url}/v1/chat/completions", json=body).json()
        second = httpx.post(f"{server.url}/v1/chat/completions", json=body).json()
        text = first["choices"][0]["message"]["content"]
        assert text == second["choices"][0]["message"]["content"] and "what is up" in text


def test_an_unknown_backend_names_the_backends_there_are() -> None:
    from sglang_omni.engines.base import build_engine

    with pytest.raises(RuntimeError) as info:
        build_engine(EngineSpec(stage="reasoner", role="reasoner", backend="vllm",
                                model_path=None, gpu=None, gpu_memory_fraction=None,
                                factory={}, engine={}))
    message = str(info.value)
    assert message.startswith("stages.reasoner.factory.backend: 'vllm'"), message
    assert "hf, native, scripted" in message, message
