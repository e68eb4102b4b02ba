"""Progress on the wire: opt-in (``include_progress`` on ``/generate``,
``stream_options.include_progress`` on chat), off by default so the spec's event sequence stays
exact; every backend reports its denoising steps (scripted per step here, native through the
cancellation plugin's step hook over the fake driver, hf in tests/hf)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.generation.kit import FAKE_DRIVER
from tests.kit import error_message, parse_sse, script
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server
from tests.umm.kit import HTTP, SMALL, final, image, video

SCRIPT = script(image("a red cube"), video("it rolls"), final("done"))
BODY = {"prompt": SCRIPT, "stage_params": {"generation": {**SMALL, "num_inference_steps": 3}}}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", "0.02") as srv:
        yield srv


def stream(server: Server, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    with HTTP.stream("POST", f"{server.url}{path}", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        return parse_sse(resp.read().decode())


def test_without_include_progress_the_spec_sequence_is_exact(server: Server) -> None:
    events = stream(server, "/generate", BODY)
    assert [e for e, _ in events] == ["segment", "segment", "segment", "complete", "message"]
    chat = stream(server, "/v1/chat/completions", {"messages": [
        {"role": "user", "content": SCRIPT}], "stage_params": BODY["stage_params"]})
    assert not any("progress" in data["choices"][0]["delta"] for _, data in chat
                   if isinstance(data, dict) and data.get("choices"))


def test_generate_streams_progress_before_each_segment(server: Server) -> None:
    events = stream(server, "/generate", {**BODY, "include_progress": True})
    names = [e for e, _ in events]
    assert names.count("segment") == 3 and names[-2:] == ["complete", "message"]
    progress = [data for event, data in events if event == "progress" and "spans" not in data]
    turns = [p for p in progress if p["stage"] == "reasoner"]
    assert [p["turn"] for p in turns] == [1, 2, 3]
    steps = [(p["modality"], p["generation"], p["turn"], p["step"], p["steps"])
             for p in progress if p["stage"] == "generation"]
    assert steps == [("image", 1, 1, 0, 3), ("image", 1, 1, 1, 3), ("image", 1, 1, 2, 3),
                     ("image", 1, 1, 3, 3), ("video", 2, 2, 0, 3), ("video", 2, 2, 1, 3),
                     ("video", 2, 2, 2, 3), ("video", 2, 2, 3, 3)]
    elapsed = [p["elapsed_s"] for p in progress]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0
    # each generation's last step comes before its segment, the next turn after it
    order = [(e, d.get("kind") if e == "segment" else d.get("stage"), d.get("step"))
             for e, d in events if e == "segment" or (e == "progress" and "spans" not in d)]
    assert order.index(("progress", "generation", 3)) < order.index(("segment", "image", None))
    assert order.index(("segment", "image", None)) < [i for i, o in enumerate(order)
                                                       if o == ("progress", "reasoner", None)][1]


def test_chat_streams_progress_as_delta_progress(server: Server) -> None:
    chunks = [data for _, data in stream(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": SCRIPT}], "stage_params": BODY["stage_params"],
        "stream_options": {"include_progress": True, "include_usage": True}})
        if isinstance(data, dict)]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    progress = [d["progress"] for d in deltas if "progress" in d]
    assert {p["stage"] for p in progress} == {"reasoner", "generation"}
    assert max(p["step"] for p in progress if p["stage"] == "generation") == 3
    assert [d["segment"]["kind"] for d in deltas if "segment" in d] == ["image", "video", "text"]
    assert chunks[-1]["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("path, body, says", [
    ("/generate", {"prompt": "hi", "include_progress": True}, "include_progress"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "stream_options": {"include_progress": True}},
     "stream_options.include_progress"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "stream_options": {"include_progress": "yes"}},
     "expected true or false"),
    ("/generate", {"prompt": "hi", "stream": True, "include_progress": 1}, "include_progress"),
])
def test_progress_needs_a_stream_and_a_boolean(server: Server, path: str, body: dict,
                                               says: str) -> None:
    resp = HTTP.post(f"{server.url}{path}", json=body)
    assert resp.status_code == 400 and says in error_message(resp)


def test_text_only_chat_refuses_progress() -> None:
    with Server(*SCRIPTED_CHAT) as chat:
        resp = HTTP.post(f"{chat.url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_progress": True}})
        assert resp.status_code == 400
        assert "text-only chat runs no generations" in error_message(resp)


def test_native_generation_reports_the_plugin_step_hook(tmp_path: Path) -> None:
    """The interleaved pipeline with the native generation engine over the fake driver, whose
    worker runs the plugin's hooks: the steps it records reach the client as progress."""
    with Server(*SCRIPTED_UMM, "--generation.gpu", "0", "--generation.factory.backend", "native",
                "--generation.factory.output_dir", str(tmp_path / "out"),
                "--model-path", "/models/cosmos3-nano",
                env={"CUDA_VISIBLE_DEVICES": "0", "SGLANG_OMNI_DIFFUSION_DRIVER": FAKE_DRIVER,
                     "FAKE_DIFFUSION_LOG": str(tmp_path), "SGLANG_PLUGINS": "",
                     "FAKE_STEP_S": "0.4"}) as native:
        events = stream(native, "/generate", {
            "prompt": script(image("a cube"), final("ok")), "include_progress": True,
            "stage_params": {"generation": {"width": 32, "height": 32,
                                            "num_inference_steps": 4}}})
    steps = [(p["step"], p["steps"]) for e, p in events
             if e == "progress" and p["stage"] == "generation"]
    assert steps[0] == (0, 4), steps  # the engine's own start
    assert any(0 < step < 4 and total == 4 for step, total in steps), steps  # the hook's
    assert [json.dumps(p) for e, p in events if e == "segment"]

