"""A client that goes away stops its generation within a few denoising steps.

Nothing here reads a clock: the stream's progress events say which step the stage had reached
when the client closed, the stage's log says the step its cancellation stopped at
(``generation cancelled at step N of M``), and the job counters of ``/metrics`` say the job was
aborted, not completed. The generations are long (:data:`STEPS` steps of :data:`STEP_S` s), so
a close that were ignored would let the job run on well past every wait here; how fast the abort
lands in seconds is a figure of ``benchmarks/serve_gpu.py`` (its disconnect row)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.kit import generation_stops, leave_when, parse_sse
from tests.server import Server
from tests.umm.kit import counts, final, image, script, umm_server, wait_for

STEP_S = 0.2
#: Steps of a generation a client leaves: 40 s of work, far past the waits below.
STEPS = 200
#: Steps the stage may still run between the progress event a client read and its abort (the
#: event's way to the client and the close's way back, on a busy 2-core host).
SLACK_STEPS = 20


@pytest.fixture(scope="module")
def server():
    with umm_server("--generation.factory.step_time_s", str(STEP_S)) as srv:
        yield srv


def slow_body(steps: int = STEPS, **extra: object) -> dict:
    return {"prompt": script(image("a slow cube"), final("too late")),
            "stage_params": {"generation": {"width": 32, "height": 32,
                                            "num_inference_steps": steps}}, **extra}


def delta(after: dict, before: dict, stage: str, outcome: str) -> float:
    return after[stage, outcome] - before[stage, outcome]


def cancelled_at(server: Server, rid: str) -> list[tuple[int, int]]:
    """(step, steps) of each ``generation cancelled at step`` line the stage logged for ``rid``."""
    return [(int(m[1]), int(m[2])) for m in re.finditer(
        rf"request {re.escape(rid)}: generation cancelled at step (\d+) of (\d+)", server.log())]


def read_until_step(lines, generation: int, step: int) -> int:  # noqa: ANN001
    """Read a streamed /generate (with include_progress) until generation ``generation`` reports
    ``step`` or more; the step it reported."""
    block: list[str] = []
    for line in lines:
        if line:
            block.append(line)
            continue
        for event, data in parse_sse("\n".join(block)):
            if event == "progress" and data.get("stage") == "generation" \
                    and data.get("generation") == generation and data["step"] >= step:
                return int(data["step"])
        block = []
    raise AssertionError(f"the stream ended before generation {generation} reached step {step}")


def test_closing_a_stream_while_generating_aborts_the_generation(server: Server) -> None:
    before = counts(server)
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate", json=slow_body(
                rid="cancel-while-generating", stream=True, include_progress=True)) as resp:
        assert resp.status_code == 200
        seen = read_until_step(resp.iter_lines(), generation=1, step=2)  # a couple of steps in
    wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    wait_for(lambda: bool(cancelled_at(server, "cancel-while-generating")))
    [(step, steps)] = cancelled_at(server, "cancel-while-generating")
    assert steps == STEPS and seen <= step <= seen + SLACK_STEPS, (seen, step)
    time.sleep(0.3)  # nothing more comes of it: no completion, no further Reasoner turn
    after = counts(server)
    assert delta(after, before, "generation", "completed") == 0
    assert delta(after, before, "reasoner", "submitted") == 1  # no turn after the close


def test_closing_a_stream_after_the_first_segment_stops_the_next_generation(
        server: Server) -> None:
    before = counts(server)
    steps = 10  # the first image is served (2 s); the second is left
    body = {"prompt": script(image("first"), image("second"), final("never")), "stream": True,
            "rid": "cancel-after-segment", "include_progress": True,
            "stage_params": {"generation": {"width": 32, "height": 32,
                                            "num_inference_steps": steps}}}
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate", json=body) as resp:
        received = []
        for line in (lines := resp.iter_lines()):
            received.append(line)
            if line.startswith("data:") and received[-2] == "event: segment":
                break
        seen = read_until_step(lines, generation=2, step=1)
    assert '"segment_index": 0' in received[-1]
    wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    wait_for(lambda: bool(cancelled_at(server, "cancel-after-segment")))
    [(step, _)] = cancelled_at(server, "cancel-after-segment")
    assert seen <= step < steps, (seen, step)  # the second image stopped before its end
    time.sleep(0.3)
    after = counts(server)
    assert delta(after, before, "generation", "completed") == 1  # only the first image
    assert delta(after, before, "reasoner", "submitted") == 2  # nothing was decided after it


def test_a_non_streaming_client_that_leaves_aborts_the_generation(server: Server) -> None:
    """A plain (non-streaming) request whose client closes its connection once the generation
    runs (as a client's read timeout does): the close is what ends it, the server's own
    timeout_s being an hour and the generation 40 s."""
    before = counts(server)
    leave_when(server, "/generate", slow_body(rid="cancel-by-leaving"),
               lambda: delta(counts(server), before, "generation", "submitted") == 1)
    wait_for(lambda: delta(counts(server), before, "generation", "aborted") == 1)
    # on a loaded host the close can reach the stage with the job's submit, before its engine
    # ran any step: the stage's log says so (step 0) instead of the engine's
    def stops() -> list[int]:
        return [step for rid, step in generation_stops(server.log()) if rid == "cancel-by-leaving"]

    wait_for(lambda: bool(stops()))
    [step] = stops()
    assert step <= SLACK_STEPS, step  # stopped near its start, not its end
    assert delta(counts(server), before, "generation", "completed") == 0


def test_server_takes_new_requests_after_cancellations(server: Server) -> None:
    resp = httpx.post(f"{server.url}/generate", timeout=30,
                      json={"prompt": script(image("quick"), final("ok")),
                            "stage_params": {"generation": {"width": 32, "height": 32,
                                                            "num_inference_steps": 1}}})
    assert resp.status_code == 200, resp.text
    assert [s["kind"] for s in resp.json()["segments"]] == ["image", "text"]
