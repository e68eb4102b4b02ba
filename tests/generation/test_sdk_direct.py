"""The SDK's direct generation against a running server (scripted generation):
``generate_image`` (generations, ``url`` answers, edits), ``generate_video`` (uploads,
progress, cancel, timeout), ``generate_action`` (saved JSON) and the WebSocket clients. Every
call returns caller-owned saved files; the server keeps no copy."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from sglang_omni.client import Client, GenerationCancelled, OmniClientError
from sglang_omni.engines.synth_media import decode_mp4_frames, encode_png, frame_pixels
from tests.generation.kit import HTTP, metric, png_size, scripted_server, wait_for
from tests.server import Server

PNG = encode_png(frame_pixels("cat", 0, 8, 8, 0))
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


@pytest.fixture(scope="module")
def server():
    with scripted_server("--generation.factory.step_time_s", "0.01") as srv:
        yield srv


def test_images_generations_url_answers_and_edits(server: Server, tmp_path: Path) -> None:
    source = tmp_path / "cat.png"
    source.write_bytes(PNG)
    with Client(server.url) as client:
        [plain] = client.generate_image("a cube", output_dir=tmp_path / "out", size="24x16",
                                        seed=2, file_name="plain")
        [fetched] = client.generate_image("a cube", output_dir=tmp_path / "out", size="24x16",
                                          seed=2, file_name="fetched", response_format="url")
        [edited] = client.generate_image("a cat", output_dir=tmp_path / "out", image=source,
                                         size="16x16")
        [by_ref] = client.generate_image("a cat", output_dir=tmp_path / "out", size="8x8",
                                         image="data:image/png;base64,"
                                               + __import__("base64").b64encode(PNG).decode())
    assert plain.read_bytes() == fetched.read_bytes() == \
        encode_png(frame_pixels("a cube", 2, 24, 16, 0))
    assert png_size(edited.read_bytes()) == (16, 16) and png_size(by_ref.read_bytes()) == (8, 8)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["plain.png", "fetched.png", edited.name, by_ref.name])


def test_video_with_an_upload_and_progress(server: Server, tmp_path: Path) -> None:
    source = tmp_path / "cat.png"
    source.write_bytes(PNG)
    seen: list[tuple[int, str]] = []
    with Client(server.url) as client:
        [video] = client.generate_video("a wave", output_dir=tmp_path, input_reference=source,
                                        width=32, height=32, num_frames=3, poll_interval_s=0.02,
                                        on_progress=lambda p, s: seen.append((p, s)))
    assert len(decode_mp4_frames(video.read_bytes())) == 3
    assert seen[-1] == (100, "completed")
    assert HTTP.get(f"{server.url}/v1/videos").json()["data"] == []


def test_cancel_and_timeout_abort_the_job(tmp_path: Path) -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as slow, \
            Client(slow.url) as client:
        cancel = threading.Event()
        timer = threading.Timer(1.0, cancel.set)
        timer.start()
        with pytest.raises(GenerationCancelled):
            client.generate_video("slow", output_dir=tmp_path, num_inference_steps=200,
                                  poll_interval_s=0.05, cancel=cancel)
        wait_for(lambda: metric(slow, "aborted") == 1, timeout=10)
        with pytest.raises(TimeoutError):
            client.generate_video("slow", output_dir=tmp_path, num_inference_steps=200,
                                  poll_interval_s=0.05, timeout_s=0.5)
        wait_for(lambda: metric(slow, "aborted") == 2, timeout=10)
        assert HTTP.get(f"{slow.url}/v1/videos").json()["data"] == []
    assert list(tmp_path.iterdir()) == []


def test_action_saved_as_json(server: Server, tmp_path: Path) -> None:
    request = {"input": {"task": "open the drawer"}, "parameters": DROID}
    with Client(server.url) as client:
        [saved] = client.generate_action(request, output_dir=tmp_path, file_name="drawer")
        body = client.generate_action(request)
        with pytest.raises(FileExistsError):
            client.generate_action(request, output_dir=tmp_path, file_name="drawer")
        with pytest.raises(OmniClientError) as refused:
            client.generate_action({"input": {"task": "t"}, "parameters": {
                **DROID, "action_horizon": "x"}})
    assert refused.value.status == 400
    assert saved == tmp_path / "drawer.json"
    assert json.loads(saved.read_text())["data"][0]["action"]["values"] == \
        body["data"][0]["action"]["values"]


def test_realtime_clients(server: Server, tmp_path: Path) -> None:
    with Client(server.url) as client:
        with client.realtime_actions() as actions:
            assert actions.metadata["object"] == "action.metadata"
            answer = actions.generate({"input": {"task": "t"}, "parameters": DROID})
            values = answer["data"][0]["action"]["values"]
            assert isinstance(values, np.ndarray) and values.shape == (16, 8)
            assert values.dtype == np.float32
        with client.realtime_video("sea", size="32x32", num_frames=3, max_chunks=2,
                                   first_frame=PNG) as session:
            chunks = []
            for chunk in session:
                chunks.append(chunk)
                if chunk.index == 0:
                    session.set_prompt("storm", event_id=1)
        assert [c.index for c in chunks] == [0, 1]
        saved = chunks[0].save(tmp_path / "chunk0.mp4")
        assert len(decode_mp4_frames(saved.read_bytes())) == 3
        with client.realtime_video("!no-media", size="32x32", num_frames=3) as failing, \
                pytest.raises(OmniClientError) as failed:
            list(failing)
        assert failed.value.status == 500
