"""Liveness from progress, not from a thread (issue 26): with the default supervision a frozen
stage process (SIGSTOP) is found by the stall timeout (3 s by default; about 5 s from the signal
to the answer in benchmarks/faults.py), where a 30 s heartbeat timeout used to leave its requests
waiting; a stage whose engine thread hangs inside a job while its process lives and
answers heartbeats (the scripted ``!hang`` directive and ``"hang": true`` script entry) is found
after its ``progress_timeout_s``. Either way its requests fail with an error naming the stage and
the stall, it is killed and restarted, and the next request is served. An engine that reports
progress (a Reasoner decoding for longer than the timeout) is never taken for hung."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import psutil
import pytest

from sglang_omni.runtime.supervisor import (
    NATIVE_SILENT_GENERATION_TIMEOUT_S,
    PROGRESS_TIMEOUT_S,
    RestartPolicy,
    default_progress_timeout_s,
)
from tests.media.media_http_server import MediaServer, serving
from tests.server import SCRIPTED_UMM, Server
from tests.supervision.kit import (
    InFlight,
    health,
    restarts,
    wait_health,
    wait_jobs,
)
from tests.supervision.kit import fast as supervised
from tests.umm.kit import final, image, post_generate, script

#: A hung engine is found after the progress timeout these tests set.
PROGRESS_S = 3.0
SMALL = {"width": 32, "height": 32}


def generate(server: Server, prompt: str, steps: int = 4, timeout: float = 60
             ) -> httpx.Response:
    return post_generate(server, {"prompt": script(image(prompt), final("done")),
                                  "stage_params": {"generation": {
                                      **SMALL, "num_inference_steps": steps}}},
                         timeout=timeout)


def reason(server: Server, entry: dict, timeout: float = 60) -> httpx.Response:
    return post_generate(server, {"prompt": script(entry)}, timeout=timeout)


def resume_and_kill(stage: psutil.Process) -> None:
    """Teardown of a stopped stage: let it go on and kill it, if the server did not (psutil
    checks the process is still the one stopped, never a later one given its pid)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            stage.send_signal(sig)
        except psutil.NoSuchProcess:
            return


def test_a_frozen_stage_is_found_with_the_default_settings() -> None:
    """No supervision flag: the default heartbeat and stall timeout find a SIGSTOPped stage
    that holds a job (a minute of steps); its request fails naming the stage, and the stage
    comes back. How fast (the 5 s target) is measured by benchmarks/faults.py, which runs the
    same defaults (its SIGSTOP rows); the defaults themselves are checked below."""
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", "0.3") as server:
        flight = InFlight(lambda: generate(server, "long", steps=200))
        wait_jobs(server, "generation", 1)
        stage = psutil.Process(server.stage_pid("generation"))
        stage.send_signal(signal.SIGSTOP)
        try:
            resp = flight.wait()
            assert resp.status_code == 500, resp.text
            message = resp.json()["error"]["message"]
            assert "generation stage stopped answering" in message, message
            assert health(server).status_code == 503
            body = wait_health(server, "ok")
            assert body["stages"]["generation"]["restarts"] == 1
            assert body["stages"]["generation"]["pid"] != stage.pid
            fault = body["stages"]["generation"]["last_fault"]
            assert fault.startswith("stalled: it has not answered its heartbeat"), fault
            assert "has not answered its heartbeat" in server.log()
        finally:
            resume_and_kill(stage)
        ok = generate(server, "back")
        assert ok.status_code == 200, ok.text


def hung_server() -> Server:
    return Server(*SCRIPTED_UMM, *supervised("reasoner", "generation", progress_s=PROGRESS_S))


@pytest.mark.parametrize("stage", ["reasoner", "generation"])
def test_an_engine_hung_inside_a_job_is_found_killed_and_restarted(stage: str) -> None:
    """The engine thread blocks for good while the process lives and answers heartbeats."""
    with hung_server() as server:
        old_pid = server.stage_pid(stage)
        if stage == "generation":
            flight = InFlight(lambda: generate(server, "!hang"))
        else:
            flight = InFlight(lambda: reason(server, {"hang": True}))
        wait_jobs(server, stage, 1)
        resp = flight.wait()
        assert resp.status_code == 500, resp.text
        message = resp.json()["error"]["message"]
        assert f"the {stage} stage made no progress" in message, message
        assert f"stages.{stage}.factory.progress_timeout_s" in message, message
        body = wait_health(server, "ok")
        assert body["stages"][stage]["restarts"] == 1
        assert "has made no progress on its" in body["stages"][stage]["last_fault"]
        assert body["stages"]["reasoner" if stage == "generation" else "generation"][
            "last_fault"] is None
        assert restarts(server, stage) == 1
        assert server.stage_pid(stage) != old_pid
        assert "directive, the engine thread hangs now" in server.log()
        # before its kill the stage wrote its threads' stacks: the frame it was stuck in
        found = server.log().index(f"the {stage} stage has made no progress")
        stacks = server.log()[found:]
        assert "(most recent call first)" in stacks and "in hang_engine_thread" in stacks
        ok = generate(server, "back")
        assert ok.status_code == 200, ok.text


def test_progress_and_engine_errors_leave_the_stage_serving() -> None:
    """A Reasoner turn of twice the progress timeout reports its decoding: it is served. An
    engine error (``!error``) fails its request only: the stage is not restarted."""
    with hung_server() as server:
        resp = reason(server, final("thought long", delay_s=2 * PROGRESS_S))
        assert resp.status_code == 200, resp.text
        failed = generate(server, "!error")
        assert failed.status_code == 500, failed.text
        message = failed.json()["error"]["message"]
        assert "generation stage failed this request unexpectedly" in message, message
        assert restarts(server, "reasoner") == 0
        assert restarts(server, "generation") == 0
        body = health(server).json()
        assert body["status"] == "ok"
        assert body["stages"]["generation"]["last_fault"] is None
        assert generate(server, "after").status_code == 200


def test_default_progress_timeouts_by_backend() -> None:
    """Unset ``progress_timeout_s`` takes its backend's default: 60 s where the engine reports
    steps or tokens, 600 s for native generation without its step reports, never for the
    native Reasoner; a value set in the config wins."""
    assert PROGRESS_TIMEOUT_S == 60.0
    for backend in ("scripted", "hf"):
        for role in ("reasoner", "generation"):
            policy = RestartPolicy.from_factory(
                {"backend": backend, "progress_timeout_s": None}, role)
            assert policy.progress_timeout_s == PROGRESS_TIMEOUT_S
    assert default_progress_timeout_s("native", "generation", {}) == PROGRESS_TIMEOUT_S
    assert default_progress_timeout_s("native", "generation", {"cancellation_plugin": False}) \
        == NATIVE_SILENT_GENERATION_TIMEOUT_S
    assert default_progress_timeout_s("native", "reasoner", {}) == 0.0
    assert RestartPolicy.from_factory({"backend": "hf", "progress_timeout_s": 5},
                                      "reasoner").progress_timeout_s == 5.0
    assert RestartPolicy.from_factory({}, "generation").stall_timeout_s == 3.0


@pytest.fixture
def trickling_host() -> Iterator[MediaServer]:
    """A loopback media host; ``/trickle`` sends a byte every 50 ms for 5 s."""
    with serving() as host:
        yield host


def test_a_stage_receiving_media_is_not_taken_for_hung(trickling_host: MediaServer) -> None:
    """A Reasoner turn whose media arrives slowly (5 s, past the 2 s progress timeout) is
    making progress: it is not failed, and the stage is not restarted."""
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "127.0.0.1",
                *supervised("reasoner", progress_s=2.0)) as server:
        body = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": script(final("{media}"), tail="")},
            {"type": "image_url", "image_url": {"url": trickling_host.url("127.0.0.1",
                                                                          "/trickle")}}]}]}
        resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert "made no progress" not in resp.text, resp.text
        assert restarts(server, "reasoner") == 0
        assert health(server).json()["status"] == "ok"
