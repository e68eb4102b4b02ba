"""The interleaved pipeline end to end over HTTP with the hf backend on the tiny checkpoint:
real generated media go back to the real Reasoner, whose decisions are valid JSON."""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from tests.kit import parse_sse  # noqa: E402
from tests.server import Server  # noqa: E402

SMALL = {"width": 64, "height": 64, "num_frames": 5, "num_inference_steps": 2, "seed": 7}
PROMPT = "Create an image of a red cube, inspect it, then create a blue cube and compare them."


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Any:
    with Server("--demo", "--model-path", str(tiny_checkpoint),
                "--orchestrator.factory.max_dispatches", "5", timeout=240) as running:
        yield running


def media_bytes(segment: dict) -> bytes:
    data = base64.b64decode(segment["data"]["url"].split(",", 1)[1])
    assert hashlib.sha256(data).hexdigest() == segment["data"]["sha256"]
    return data


def test_streaming_request_yields_real_segments(server: Server) -> None:
    from PIL import Image

    body = {"prompt": PROMPT, "stream": True, "stage_params": {"generation": SMALL}}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[-1] == ("message", "[DONE]")
    segments = [data for name, data in events if name == "segment"]
    complete = [data for name, data in events if name == "complete"]
    assert complete and complete[0]["finish_reason"] == "stop"
    assert [s["segment_index"] for s in segments] == list(range(len(segments)))
    media = [s for s in segments if s["kind"] != "text"]
    assert media, "greedy decisions of the tiny checkpoint generate first"
    for segment in media:
        if segment["kind"] == "image":
            assert Image.open(io.BytesIO(media_bytes(segment))).size == (64, 64)
    assert len(media) <= 2  # max_dispatches 5: two generations and three Reasoner turns


def test_image_and_video_return_to_the_reasoner(server: Server) -> None:
    """Sampled decisions (a client seed) vary; some seed of a fixed list makes both an image
    and a video in one request, each fed back to the Reasoner for the next decision."""
    tried = []
    for seed in range(16):
        body = {"prompt": PROMPT, "temperature": 1.0, "seed": seed,
                "stage_params": {"generation": SMALL}}
        response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
        assert response.status_code == 200, response.text
        kinds = [s["kind"] for s in response.json()["segments"]]
        tried.append(kinds)
        if "image" in kinds and "video" in kinds:
            break
    else:
        pytest.fail(f"no seed made both an image and a video: {tried}")
    assert kinds[-1] == "text" or kinds.count("text") == 0


def test_the_demo_says_its_weights_are_random(server: Server, tiny_checkpoint: Path) -> None:
    """The tiny checkpoint carries the builder's note; the server reads it and says so in its
    ready line and in /server_info (the playground shows /server_info's notice)."""
    from sglang_omni.models import random_weights

    assert (tiny_checkpoint / random_weights.MARKER).is_file()
    info = httpx.get(f"{server.url}/server_info").json()
    assert info["random_weights"] is True and info["mode"] == "umm"
    assert info["notice"].startswith("random weights: images are noise")
    assert "sgl-omni make-checkpoint --shape tiny --seed 0" in info["notice"]
    ready = [line for line in server.log().splitlines() if "sgl-omni: ready in" in line]
    assert len(ready) == 1 and f"({info['notice']}): open {server.url}/" in ready[0]
