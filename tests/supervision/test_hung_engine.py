"""A hung engine (a GPU hang, a deadlocked native engine): the stage process still answers its
heartbeat from its reader thread, but its engine makes no progress on the jobs it holds. After
``progress_timeout_s`` its requests fail with a clear 500, it is killed and restarted, and the
server serves again, instead of every request waiting for its ``timeout_s`` behind the hung job.
A generation that reports its denoising steps is never taken for hung, however long it runs; an
aborted job the stage never ends still counts as held."""

from __future__ import annotations

import httpx

from tests.kit import wait_until
from tests.server import SCRIPTED_UMM, Server
from tests.supervision.kit import (
    InFlight,
    health,
    process_tree,
    restarts,
    wait_health,
    wait_jobs,
)
from tests.supervision.kit import fast as supervised
from tests.umm.kit import final, image, post_generate, script

PROGRESS_S = 1.5
SMALL = {"width": 32, "height": 32}


def hung_server(*extra: str) -> Server:
    return Server(*SCRIPTED_UMM, *supervised("reasoner", stall_s=30.0),
                  *supervised("generation", stall_s=30.0, progress_s=PROGRESS_S), *extra)


def generate(server: Server, prompt: str, steps: int = 4, timeout: float = 60) -> httpx.Response:
    return post_generate(server, {"prompt": script(image(prompt), final("done")),
                                  "stage_params": {"generation": {
                                      **SMALL, "num_inference_steps": steps}}},
                         timeout=timeout)


def test_hung_generation_fails_its_request_and_restarts() -> None:
    with hung_server() as server:
        tree = process_tree(server)
        old_pid = server.stage_pid("generation")
        flight = InFlight(lambda: generate(server, "!sleep=60 hung"))
        wait_jobs(server, "generation", 1)
        resp = flight.wait()  # before the 60 s the job holds: the progress timeout ended it
        assert resp.status_code == 500, resp.text
        message = resp.json()["error"]["message"]
        assert "generation stage made no progress" in message, message
        assert "progress_timeout_s" in message, message
        assert health(server).status_code == 503
        body = wait_health(server, "ok")
        assert body["stages"]["generation"]["restarts"] == 1
        assert restarts(server, "generation") == 1
        assert server.stage_pid("generation") != old_pid
        assert len(process_tree(server)) == len(tree)
        assert "no progress on its 1 job(s)" in server.log()
        ok = generate(server, "back")
        assert ok.status_code == 200, ok.text


def test_a_generation_reporting_its_steps_runs_past_the_timeout() -> None:
    """Ten steps of 0.3 s: 3 s of generation, each step well inside the 1.5 s timeout."""
    with hung_server("--generation.factory.step_time_s", "0.3") as server:
        resp = generate(server, "slow but alive", steps=10)
        assert resp.status_code == 200, resp.text
        assert restarts(server, "generation") == 0
        assert health(server).json()["status"] == "ok"


def test_an_aborted_job_the_stage_never_ends_is_still_caught() -> None:
    """The client leaves; the stage's engine never ends the aborted job (its abort hangs too).
    The server stops waiting for the abort after a while, but the stage still holds the job,
    and is restarted once it made no progress for the timeout."""
    with hung_server() as server:

        def leave_early() -> None:
            try:
                generate(server, "!sleep=60 !abort-delay=60 hung", timeout=0.8)
            except httpx.TimeoutException:
                return
            raise AssertionError("the request ended before the client left")

        flight = InFlight(leave_early)
        wait_jobs(server, "generation", 1)
        flight.wait()
        body = wait_health(server, "ok", timeout=PROGRESS_S + 30)
        if body["stages"]["generation"]["restarts"] == 0:  # not yet noticed: wait for it
            wait_until(lambda: restarts(server, "generation") > 0, timeout=PROGRESS_S + 30)
            wait_health(server, "ok")
        assert restarts(server, "generation") == 1
        assert "no progress on its 1 job(s)" in server.log()
        ok = generate(server, "back")
        assert ok.status_code == 200, ok.text
