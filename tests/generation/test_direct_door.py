"""The direct routes and realtime sessions reach the generation stage through the pipeline's
door (``pipeline.direct``), over HTTP: every generation holds a request state while it runs
(its request id claimed there; ``sgl_omni_request_states`` counts it) and releases it when it
ends however it ends (answered, its client gone, its job deleted), and takes its admission
ticket from ``pipeline.admission`` (503 with Retry-After when refused; the refused request's
state is released too). Before, these requests went from the HTTP layer straight to the stage
handle, and no state held them: the gauge stayed 0 while they ran.

One server: 0.25 s per denoising step, so a 200-step generation runs until its client leaves
or its job is deleted; ``server.max_direct_queue`` 1. Every step syncs on /metrics or the
answers, never on time.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from sglang_omni.pipeline.admission.video_jobs import MAX_VIDEO_JOBS
from tests.generation.kit import (
    HTTP,
    closed_code,
    error_of,
    metric,
    recv,
    scripted_server,
    wait_for,
    ws,
)
from tests.kit import job_counts
from tests.kit import request_states as states
from tests.server import Server

STEPS = 200  # 200 steps of 0.25 s: 50 s unless the generation is aborted
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}
IMAGE = {"prompt": "slow", "size": "32x32", "num_inference_steps": STEPS}
ACTION = {"input": {"task": "t"}, "parameters": {**DROID, "num_inference_steps": STEPS}}
QUICK_ACTION = {"input": {"task": "t"}, "parameters": {**DROID, "num_inference_steps": 1}}
VIDEO = {"prompt": "slow", "width": 16, "height": 16, "num_frames": 2,
         "num_inference_steps": STEPS}
INIT = {"type": "init", "prompt": "sea", "size": "32x32", "num_frames": 3}
RID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with scripted_server("--generation.factory.step_time_s", "0.25",
                         "--server.max_direct_queue", "1") as srv:
        yield srv


def refusals(server: Server, reason: str) -> float:
    for line in HTTP.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(f'sgl_omni_admission_refusals_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def waiting_client(server: Server, route: str, body: dict[str, Any]) -> socket.socket:
    """A client that sent ``body`` to ``route`` and waits for the answer until the test closes
    its connection (which aborts the generation)."""
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def refused(resp: Any, says: str) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"]
    assert says in error_of(resp)["message"], resp.text


def at_rest(server: Server) -> None:
    """No request state live, and every job the stage got ended (the previous test's)."""
    def ended() -> bool:
        jobs = {outcome: n for (stage, outcome), n in job_counts(server).items()
                if stage == "generation"}
        return jobs.get("submitted", 0) == sum(jobs.get(outcome, 0) for outcome in
                                               ("completed", "failed", "aborted"))

    wait_for(lambda: states(server) == 0, timeout=60)
    try:
        wait_for(ended, timeout=60)
    except AssertionError:
        raise AssertionError(f"the stage's jobs did not all end: {job_counts(server)}") from None


@pytest.mark.parametrize(("route", "body", "other", "other_body"), [
    ("/v1/images/generations", IMAGE, "/v1/actions/generations", QUICK_ACTION),
    ("/v1/actions/generations", ACTION, "/v1/images/generations",
     {**IMAGE, "num_inference_steps": 1}),
])
def test_a_waiting_request_holds_its_state_until_its_client_leaves(
        server: Server, route: str, body: dict[str, Any], other: str,
        other_body: dict[str, Any]) -> None:
    at_rest(server)
    submitted, aborted = metric(server, "submitted"), metric(server, "aborted")
    queue_refusals = refusals(server, "direct_queue")
    client = waiting_client(server, route, body)
    try:
        wait_for(lambda: metric(server, "submitted") == submitted + 1, timeout=30)
        assert states(server) == 1  # its request id is claimed on its state while it runs
        refused(HTTP.post(f"{server.url}{other}", json=other_body), "server.max_direct_queue 1")
        assert refusals(server, "direct_queue") == queue_refusals + 1
        assert metric(server, "submitted") == submitted + 1  # refused before the stage
    finally:
        client.close()
    wait_for(lambda: metric(server, "aborted") == aborted + 1, timeout=30)
    wait_for(lambda: states(server) == 0, timeout=30)  # released, the refused one's too
    quick = HTTP.post(f"{server.url}{other}", json=other_body)  # its ticket was released
    assert quick.status_code == 200, quick.text
    assert RID.match(quick.json().get("id", "")), quick.text
    assert states(server) == 0


def test_a_video_job_holds_its_state_until_it_is_deleted(server: Server) -> None:
    """A job's state outlives its answer: its id is the job's, held while it is queued or
    running, released when it is deleted (queued jobs whose generation never started too).
    Over ``MAX_VIDEO_JOBS`` unfinished jobs, the next is refused with 503."""
    at_rest(server)
    aborted = metric(server, "aborted")
    jobs = []
    try:
        for _ in range(MAX_VIDEO_JOBS):
            resp = HTTP.post(f"{server.url}/v1/videos", json=VIDEO)
            assert resp.status_code == 200, resp.text
            jobs.append(resp.json()["id"])
        assert all(RID.match(job) for job in jobs)
        assert states(server) == MAX_VIDEO_JOBS
        refused(HTTP.post(f"{server.url}/v1/videos", json=VIDEO),
                f"{MAX_VIDEO_JOBS} video jobs are queued or running")
        assert states(server) == MAX_VIDEO_JOBS  # the refused job holds nothing
    finally:
        for job in jobs:
            HTTP.delete(f"{server.url}/v1/videos/{job}")
    wait_for(lambda: states(server) == 0, timeout=60)
    wait_for(lambda: metric(server, "aborted") > aborted, timeout=30)


def test_a_realtime_action_holds_a_state_for_its_generation(server: Server) -> None:
    at_rest(server)
    aborted = metric(server, "aborted")
    submitted = metric(server, "submitted")
    with ws(server, "/v1/actions/realtime") as busy:
        recv(busy)
        assert states(server) == 0  # a session between its actions holds none
        busy.send(msgpack.packb(ACTION))
        wait_for(lambda: metric(server, "submitted") == submitted + 1, timeout=30)
        assert states(server) == 1
        refused(HTTP.post(f"{server.url}/v1/images/generations", json=IMAGE),
                "server.max_direct_queue 1")
        with ws(server, "/v1/actions/realtime") as second:  # the same refusal as HTTP
            recv(second)
            second.send(msgpack.packb(QUICK_ACTION))
            error = recv(second)
            assert error["code"] == 503 and "server.max_direct_queue 1" in error["error"], error
            assert closed_code(second) == 1011
    wait_for(lambda: metric(server, "aborted") == aborted + 1, timeout=30)
    wait_for(lambda: states(server) == 0, timeout=30)


def test_a_realtime_video_chunk_holds_a_state_for_its_generation(server: Server) -> None:
    at_rest(server)
    aborted = metric(server, "aborted")
    with ws(server, "/v1/realtime_video/generate") as quick:  # each chunk names its rid
        quick.send(msgpack.packb({**INIT, "max_chunks": 2, "num_inference_steps": 1}))
        rids = [recv(quick)["request_id"] for _ in range(2)]
        assert closed_code(quick) == 1000
    assert all(RID.match(rid) for rid in rids) and rids[0] != rids[1], rids
    wait_for(lambda: states(server) == 0, timeout=30)
    submitted = metric(server, "submitted")
    with ws(server, "/v1/realtime_video/generate") as slow:
        slow.send(msgpack.packb({**INIT, "num_inference_steps": STEPS}))
        wait_for(lambda: metric(server, "submitted") == submitted + 1, timeout=30)
        assert states(server) == 1
        refused(HTTP.post(f"{server.url}/v1/actions/generations", json=QUICK_ACTION),
                "server.max_direct_queue 1")
    wait_for(lambda: metric(server, "aborted") == aborted + 1, timeout=30)
    wait_for(lambda: states(server) == 0, timeout=30)
