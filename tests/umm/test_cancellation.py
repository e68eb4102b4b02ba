"""A client that goes away stops its generation within about one denoising step (0.2 s here)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server import Server
from tests.umm.kit import counts, final, image, script, umm_server, wait_for

STEP_S = 0.2
ABORT_WITHIN_S = 1.5  # about one denoising step plus polling, with room for a busy 2-core host


@pytest.fixture(scope="module")
def server():
    with umm_server("--generation.factory.step_time_s", str(STEP_S)) as srv:
        yield srv


def slow_body(steps: int = 50, **extra: object) -> dict:
    return {"prompt": script(image("a slow cube"), final("too late")),
            "stage_params": {"generation": {"width": 32, "height": 32,
                                            "num_inference_steps": steps}}, **extra}


def delta(after: dict, before: dict, stage: str, outcome: str) -> float:
    return after[stage, outcome] - before[stage, outcome]


def cancelled_lines(server: Server, rid: str) -> list[str]:
    return [line for line in server.log().splitlines()
            if f"request {rid}: generation cancelled at step" in line]


def test_closing_a_stream_while_generating_aborts_the_generation(server: Server) -> None:
    before = counts(server)
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate",
            json=slow_body(rid="cancel-while-generating", stream=True)) as resp:
        assert resp.status_code == 200
        wait_for(lambda: delta(counts(server), before, "generation", "submitted") == 1)
        time.sleep(2 * STEP_S)  # a couple of steps in
        closed = time.monotonic()
    took = wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    assert time.monotonic() - closed < ABORT_WITHIN_S, took
    wait_for(lambda: bool(cancelled_lines(server, "cancel-while-generating")))
    time.sleep(0.3)
    after = counts(server)
    assert delta(after, before, "generation", "completed") == 0
    assert delta(after, before, "reasoner", "submitted") == 1  # no turn after the close


def test_closing_a_stream_after_the_first_segment_stops_the_next_generation(
        server: Server) -> None:
    before = counts(server)
    body = {"prompt": script(image("first"), image("second"), final("never")), "stream": True,
            "rid": "cancel-after-segment",
            "stage_params": {"generation": {"width": 32, "height": 32,
                                            "num_inference_steps": 5}}}
    received = []
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate", json=body) as resp:
        lines = resp.iter_lines()
        for line in lines:
            received.append(line)
            if line.startswith("data:"):
                break
        wait_for(lambda: delta(counts(server), before, "generation", "submitted") == 2)
        time.sleep(STEP_S)
        closed = time.monotonic()
    wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    assert time.monotonic() - closed < ABORT_WITHIN_S
    assert received[0] == "event: segment" and '"segment_index": 0' in received[1]
    wait_for(lambda: bool(cancelled_lines(server, "cancel-after-segment")))
    time.sleep(0.3)
    after = counts(server)
    assert delta(after, before, "generation", "completed") == 1  # only the first image
    assert delta(after, before, "reasoner", "submitted") == 2  # nothing was decided after it


def test_non_streaming_client_timeout_aborts_the_generation(server: Server) -> None:
    before = counts(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/generate", json=slow_body(rid="cancel-by-timeout"),
                   timeout=httpx.Timeout(30, read=0.8))
    gone = time.monotonic()
    wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    assert time.monotonic() - gone < ABORT_WITHIN_S
    wait_for(lambda: bool(cancelled_lines(server, "cancel-by-timeout")))
    assert delta(counts(server), before, "generation", "completed") == 0


def test_server_takes_new_requests_after_cancellations(server: Server) -> None:
    resp = httpx.post(f"{server.url}/generate", timeout=30,
                      json={"prompt": script(image("quick"), final("ok")),
                            "stage_params": {"generation": {"width": 32, "height": 32,
                                                            "num_inference_steps": 1}}})
    assert resp.status_code == 200, resp.text
    assert [s["kind"] for s in resp.json()["segments"]] == ["image", "text"]
