"""The interleaved pipeline end to end over HTTP with the hf backend on the tiny checkpoint:
real generated media go back to the real Reasoner, whose decisions are valid JSON."""

from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("llguidance")

from tests.kit import parse_sse, wait_until  # noqa: E402
from tests.metrics.kit import Scrape  # noqa: E402
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
    from sglang_omni.config import random_weights

    assert (tiny_checkpoint / random_weights.MARKER).is_file()
    info = httpx.get(f"{server.url}/server_info").json()
    assert info["random_weights"] is True and info["mode"] == "umm"
    assert info["notice"].startswith("random weights: images are noise")
    assert "sgl-omni make-checkpoint --shape tiny --seed 0" in info["notice"]
    ready = [line for line in server.log().splitlines() if "sgl-omni: ready in" in line]
    assert len(ready) == 1 and f"({info['notice']}): open {server.url}/" in ready[0]


def test_the_reasoner_keeps_each_request_context_until_it_ends(tiny_checkpoint: Path) -> None:
    """Each generated media item is encoded by the Reasoner stage once, on the turn after its
    generation, and kept for the later turns; the server tells the stage when the request
    ended, and the stage releases what it kept. On a server of its own: the counters compared
    move for this request only (on the shared server, an earlier request's counts could still
    be on their way in a heartbeat when the test read them first)."""
    with Server("--demo", "--model-path", str(tiny_checkpoint),
                "--orchestrator.factory.max_dispatches", "5", timeout=240) as server:
        check_the_request_context(server)


def check_the_request_context(server: Server) -> None:
    def held() -> float:
        return Scrape(server).value("sgl_omni_reasoner_context_bytes", stage="reasoner")

    before = Scrape(server)  # a new server: nothing counted yet
    rid = "hf-context-1"
    body = {"prompt": PROMPT, "rid": rid, "stage_params": {"generation": SMALL}}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    generated = [s for s in response.json()["segments"] if s["kind"] != "text"]
    assert generated, "greedy decisions of the tiny checkpoint generate first"
    ended = re.compile(rf"request {rid} ended; released (\d+) context bytes; contexts hold "
                       r"(\d+) bytes of (\d+) requests")
    assert wait_until(lambda: ended.search(server.log()) is not None, timeout=30), server.log()
    found = ended.search(server.log())
    assert found is not None and int(found[1]) > 0 and found.groups()[1:] == ("0", "0")
    turns = re.findall(rf"request {rid}: context: (\d+) of (\d+) prompt tokens reused, \d+ "
                       r"prefilled; media (\d+) kept, (\d+) encoded", server.log())
    assert len(turns) == len(generated) + 1, turns  # a Reasoner turn before and after each
    for index, (_, _, kept, encoded) in enumerate(turns):
        assert (int(kept), int(encoded)) == (max(0, index - 1), min(index, 1)), turns
    assert all(int(reused) > 0 for reused, _, _, _ in turns[1:]), turns
    # /metrics: the stage's heartbeats carry the same counters; nothing is held once it ended.
    assert wait_until(lambda: held() == 0 and Scrape(server).value(
        "sgl_omni_reasoner_context_media_total", stage="reasoner", outcome="miss")
        - before.value("sgl_omni_reasoner_context_media_total", stage="reasoner",
                       outcome="miss") == len(generated), timeout=30)
    after = Scrape(server)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, stage="reasoner", **labels) - before.value(
            name, stage="reasoner", **labels)

    assert grew("sgl_omni_reasoner_context_media_total", outcome="hit") \
        == sum(int(kept) for _, _, kept, _ in turns)
    assert grew("sgl_omni_reasoner_prompt_tokens_total", source="reused") \
        == sum(int(reused) for reused, _, _, _ in turns)
    assert grew("sgl_omni_reasoner_prompt_tokens_total", source="reused") \
        + grew("sgl_omni_reasoner_prompt_tokens_total", source="prefilled") \
        == sum(int(prompt) for _, prompt, _, _ in turns)


def test_a_client_that_leaves_releases_the_request_context(server: Server) -> None:
    """The client leaves once the first generated media arrived (the Reasoner holds the first
    turn's context by then): the Reasoner's next turn is aborted (or, between dispatches, the
    request ends), and either way the stage releases the request's context."""
    rid = "hf-context-left"
    body = {"prompt": PROMPT, "rid": rid, "stream": True,
            "stage_params": {"generation": SMALL}}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: segment"):
                break  # the first segment is the first generated media (greedy decisions)
    ended = re.compile(rf"request {rid} ended; released (\d+) context bytes")
    assert wait_until(lambda: ended.search(server.log()) is not None, timeout=30), server.log()
    assert wait_until(lambda: Scrape(server).value("sgl_omni_reasoner_context_bytes",
                                                   stage="reasoner") == 0, timeout=30)


HF_READY = re.compile(r"ready \(backend hf\) [\d.]+ s after the process started: [\d.]+ s to "
                      r"reach the engine, ([\d.]+) s in the engine's start \(engine module "
                      r"([\d.]+) s, imports ([\d.]+) s, weights ([\d.]+) s, warm-up ([\d.]+) s, "
                      r"other ([\d.]+) s; beside them: weights read-ahead ([\d.]+) s\)$")


def test_each_stage_ready_line_splits_its_start_into_imports_weights_and_warm_up(
        server: Server) -> None:
    """Where a stage's start went, in its ready line: the engine's module, the libraries'
    imports, the weights, the warm-up (none on the CPU), what is left, and the weights'
    read-ahead that ran beside them (CUDA's initialisation too, on a GPU)."""
    lines = [line for line in server.log().splitlines() if "ready (backend hf)" in line]
    assert len(lines) == 2
    for line in lines:
        m = HF_READY.search(line)
        assert m, line
        total, *parts = (float(v) for v in m.groups()[:6])
        assert parts[1] > 0 and parts[2] > 0  # imports and weights are measured
        assert abs(total - sum(parts)) <= 0.35  # six parts, each rounded to 0.1 s
