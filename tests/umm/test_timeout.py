"""A request that outlives stages.orchestrator.factory.timeout_s fails with an error naming it."""

from __future__ import annotations

import time

import pytest

from tests.server import Server
from tests.umm.kit import (
    counts,
    final,
    image,
    only,
    post_generate,
    script,
    segments_of,
    stream_generate,
    umm_server,
    wait_for,
)

TIMEOUT_S = 3  # long enough that a loaded machine still reaches the generation


@pytest.fixture(scope="module")
def server():
    with umm_server("--generation.factory.step_time_s", "0.2",
                    "--orchestrator.factory.timeout_s", str(TIMEOUT_S)) as srv:
        yield srv


SLOW = {"prompt": script(image("slow"), final("too late")),
        "stage_params": {"generation": {"width": 32, "height": 32, "num_inference_steps": 50}}}


def test_non_streaming_request_gets_the_timeout_status(server: Server) -> None:
    start = time.monotonic()
    resp = post_generate(server, SLOW)
    took = time.monotonic() - start
    assert resp.status_code == 504, resp.text
    error = resp.json()["error"]
    assert error["code"] == 504 and error["type"] == "timeout_error"
    assert "stages.orchestrator.factory.timeout_s" in error["message"]
    # never before the deadline; what ended it is the message above, the 504 (the generation
    # left would take 10 s more and end 200) and the abort test below, not an upper bound
    assert took >= TIMEOUT_S


def test_streaming_request_gets_an_error_event_with_the_timeout_code(server: Server) -> None:
    status, events = stream_generate(server, SLOW)
    assert status == 200
    assert segments_of(events) == []
    error = only(events, "error")
    assert error["code"] == 504 and error["type"] == "timeout_error"
    assert "timeout_s" in error["message"]
    assert events[-1] == ("message", "[DONE]")


def settled(server: Server) -> dict:
    """The stage counters once every earlier job has reported how it ended (an abort's
    acknowledgement may still be on its way when the previous test returns)."""
    def done() -> bool:
        c = counts(server)
        return c["generation", "submitted"] == sum(
            c["generation", outcome] for outcome in ("completed", "failed", "aborted"))
    wait_for(done)
    return counts(server)


def test_timed_out_generation_is_aborted(server: Server) -> None:
    before = settled(server)
    assert post_generate(server, SLOW).status_code == 504
    wait_for(lambda: counts(server)["generation", "aborted"] == before["generation",
                                                                       "aborted"] + 1)
    assert counts(server)["generation", "completed"] == before["generation", "completed"]


def test_a_turn_that_outlives_the_deadline_also_times_out(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(final("late", delay_s=TIMEOUT_S + 3))})
    assert resp.status_code == 504
    assert f"timeout_s ({TIMEOUT_S} s)" in resp.json()["error"]["message"]
