"""Stage faults with requests in flight: ``kill -9`` (as the OOM killer does) and ``SIGSTOP``
(a frozen stage) of each stage of the interleaved, text-only chat and direct generation
servers. Each in-flight request (each would hold its stage for a minute) ends with a clear
error naming the stage, the server's log and ``sgl_omni_stage_failed_requests_total`` count every
request the fault failed as the stage went (those waiting for the stage too: failed at the
exit, not by a later timeout), every request's state is released
(``sgl_omni_request_states`` back to 0), the stage restarts (``/health``
back to 200 "ok" with a new pid), the next request succeeds, no temp file is left, and after a
graceful stop no process is left. How fast, in seconds, is ``benchmarks/faults.py``'s figure;
nothing here reads a clock but for safety nets far below the minute the requests hold.

The servers run with quick supervision: a 0.2 s heartbeat, a 1 s stall time, a 0.2 s restart
backoff and room for 10 restarts.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.kit import job_counts, no_request_states, wait_until
from tests.reliability.in_flight import GEN, IN_GENERATION, IN_REASONER, InFlight, interleaved
from tests.reliability.kit import (
    TrackedServer,
    healthy,
    script,
    tracked_server,
)
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM

STALL_S = 1.0
#: Safety nets, not figures: a request not answered this long after the fault (it holds its
#: stage for 60 s), a stage not back this long after it.
ANSWERED_WITHIN_S = 30.0
RESTART_WITHIN_S = 60.0


def supervision(*stages: str) -> list[str]:
    flags = []
    for stage in stages:
        for key, value in (("heartbeat_interval_s", "0.2"), ("stall_timeout_s", str(STALL_S)),
                           ("restart_backoff_s", "0.2"), ("max_restarts", "10"),
                           ("restart_window_s", "600")):
            flags += [f"--{stage}.factory.{key}", value]
    return flags


@pytest.fixture(scope="module")
def umm_faults() -> Iterator[TrackedServer]:
    with tracked_server(*SCRIPTED_UMM, *supervision("reasoner", "generation")) as srv:
        yield srv


@pytest.fixture(scope="module")
def chat_faults() -> Iterator[TrackedServer]:
    with tracked_server(*SCRIPTED_CHAT, *supervision("reasoner")) as srv:
        yield srv


@pytest.fixture(scope="module")
def direct_faults() -> Iterator[TrackedServer]:
    with tracked_server(*SCRIPTED_GENERATION, *supervision("generation")) as srv:
        yield srv


# --- in-flight requests ----------------------------------------------------------------------
def problem(request: InFlight, stage: str) -> str | None:
    """None if ``request`` ended with a clear error naming ``stage``."""
    if request.ended is None:
        return f"{request.label}: not answered {ANSWERED_WITHIN_S:g} s after the fault"
    error, wrong = request.error((500, 503))
    if error is None:
        return wrong
    if error.get("code") not in (500, 503) or stage not in str(error.get("message")).lower():
        return f"{request.label}: the error does not name the {stage} stage: {error!r}"
    if "unhealthy" in str(error.get("message")):  # the stage comes back: say what happened
        return f"{request.label}: told the server is unhealthy, though {stage} restarts: " \
            f"{error!r}"
    return None


def in_flight(kind: str, stage: str) -> list[InFlight]:
    """The requests to have running when ``stage`` of a ``kind`` server fails."""
    if kind == "chat":
        messages = [{"role": "user", "content": IN_REASONER}]
        return [InFlight("chat", "/v1/chat/completions", {"messages": messages}),
                InFlight("chat stream", "/v1/chat/completions",
                         {"messages": messages, "stream": True})]
    prompts = [IN_GENERATION] + ([IN_REASONER] if stage == "reasoner" else [])
    return [r for prompt in prompts for r in interleaved(
        prompt, "in generation" if prompt is IN_GENERATION else "in a Reasoner turn")]


def start_video_job(server: TrackedServer) -> str:
    resp = httpx.post(f"{server.url}/v1/videos", json={
        "prompt": "!sleep=60 held", "size": "32x32", "num_frames": 3}, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def video_job_problem(server: TrackedServer, video_id: str, stage: str, signalled: float
                      ) -> str | None:
    while True:
        job = httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=5).json()
        if job["status"] == "failed":
            break
        if time.monotonic() - signalled > ANSWERED_WITHIN_S:
            return f"video job still {job['status']} {ANSWERED_WITHIN_S:g} s after the fault"
        time.sleep(0.05)
    if stage not in str(job["error"]).lower():
        return f"the video job's error does not name the {stage} stage: {job['error']!r}"
    return None


def next_request(kind: str, stage: str, server: TrackedServer) -> str | None:
    """None if a request using the restarted ``stage`` succeeds."""
    try:
        if kind == "direct":
            resp = httpx.post(f"{server.url}/v1/images/generations",
                              json={"prompt": "after", "size": "32x32"}, timeout=20)
        elif kind == "chat":
            resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=20,
                              json={"messages": [{"role": "user", "content": "after"}]})
        else:
            entries = [{"action": "image", "prompt": "after"}] if stage == "generation" else []
            resp = httpx.post(f"{server.url}/generate", timeout=20, json={
                "prompt": script(*entries, {"action": "final", "text": "ok"}),
                "stage_params": GEN})
    except httpx.HTTPError as exc:
        return f"the next request failed: {exc!r}"
    if resp.status_code != 200:
        return f"the next request got {resp.status_code}: {resp.text[:300]}"
    return None


def wait_restarted(server: TrackedServer, stage: str, old_pid: int) -> str | None:
    deadline = time.monotonic() + RESTART_WITHIN_S
    while time.monotonic() < deadline:
        try:
            pid = server.server.stage_pid(stage)
        except (httpx.HTTPError, KeyError, ValueError):
            pid = None
        if pid not in (None, old_pid) and healthy(server.server):
            return None
        time.sleep(0.1)
    health = httpx.get(f"{server.url}/health", timeout=5)
    return f"the {stage} stage did not come back within {RESTART_WITHIN_S:g} s: " \
           f"{health.status_code} {health.text}"


def failed_requests(server: TrackedServer, stage: str) -> float:
    """``sgl_omni_stage_failed_requests_total`` of ``stage``."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "sgl_omni_stage_failed_requests_total"
                and s.labels.get("stage") == stage)


def counted_problem(server: TrackedServer, stage: str, before: float, log_from: int,
                    failed: int) -> str | None:
    """None if the metric grew by ``failed`` and the log's line of the exit says ``failed``."""
    counted = failed_requests(server, stage) - before
    said = re.findall(rf"the {stage} stage process exited with code \S+; (\d+) request\(s\) "
                      r"in flight failed with it", server.server.log()[log_from:])
    if counted != failed or said != [str(failed)]:
        return (f"{failed} request(s) failed, but sgl_omni_stage_failed_requests_total grew by "
                f"{counted:g} and the log said {said}")
    return None


def plan_phases(server: TrackedServer) -> Counter[str]:
    """How many requests of ``/v1/queue``'s plan are in each phase."""
    return Counter(p["phase"] for p in httpx.get(f"{server.url}/v1/queue", timeout=10)
                   .json()["plan"])


def at_their_stages(kind: str, stage: str, server: TrackedServer,
                    before: dict[tuple[str, str], float]) -> bool:
    """Whether every request of :func:`in_flight` (or the video job) holds its stage: each
    Reasoner turn started, and on the interleaved server the held generations are running,
    paused or queued for the stage (``/v1/queue``), so that the fault fails each of them. (The
    requests' Reasoner turns end in any order, so an older request's generation may arrive
    second and pause the younger one's: a paused generation is held by the stage too.)"""
    now = job_counts(server.server)

    def started(name: str) -> float:
        return now.get((name, "submitted"), 0) - before.get((name, "submitted"), 0)

    if kind == "direct":
        return started("generation") == 1
    if kind == "chat":
        return started("reasoner") == 2
    held_in_reasoner = 3 if stage == "reasoner" else 0
    phases = plan_phases(server)
    return started("reasoner") == 3 + held_in_reasoner and started("generation") >= 1 \
        and phases["generating"] + phases["paused"] + phases["queued"] == 3 \
        and phases["reasoning"] == held_in_reasoner


def fault(kind: str, server: TrackedServer, stage: str, sig: signal.Signals) -> None:
    baseline = server.temp_files()
    requests = in_flight(kind, stage) if kind != "direct" else []
    before = job_counts(server.server)
    threads = [r.start(server.url) for r in requests]
    video_id = start_video_job(server) if kind == "direct" else None
    reached = wait_until(lambda: at_their_stages(kind, stage, server, before), timeout=60)
    assert reached, ("the requests never all reached their stages: "
                     f"{job_counts(server.server)}, plan {plan_phases(server)}")
    assert all(r.ended is None for r in requests), [(r.label, r.status, r.text[:200])
                                                     for r in requests if r.ended is not None]
    pid = server.server.stage_pid(stage)
    server.remember()
    counted_before = failed_requests(server, stage)
    log_from = len(server.server.log())
    signalled = time.monotonic()
    os.kill(pid, sig)
    for thread in threads:  # they are left running (daemons) if they do not end
        thread.join(max(0.0, signalled + ANSWERED_WITHIN_S - time.monotonic()))
    problems = [p for r in requests if (p := problem(r, stage)) is not None]
    if video_id is not None:
        job = video_job_problem(server, video_id, stage, signalled)
        if job is not None:
            problems.append(job)
    restarted = wait_restarted(server, stage, pid)
    # every request in flight failed (the video job is one stage call)
    counted = counted_problem(server, stage, counted_before, log_from, len(requests) or 1)
    if counted is not None:
        problems.append(counted)
    server.remember()
    if restarted is not None:
        problems.append(restarted)
    elif (after := next_request(kind, stage, server)) is not None:
        problems.append(after)
    left = sorted((Counter(server.temp_files()) - Counter(baseline)).elements())
    if left:
        problems.append(f"temp files left: {left}")
    if (states := no_request_states(server.server)) is not None:  # each request released
        problems.append(states)
    assert not problems, f"{sig.name} of the {stage} stage:\n" + "\n".join(
        f"- {p}" for p in problems)


def no_orphans_or_temp_files(server: TrackedServer) -> None:
    orphans = server.graceful_stop()
    left = server.temp_files(sockets=True)
    assert not orphans, f"processes left after the server stopped: {orphans}"
    assert not left, f"temp files left after the server stopped: {left}"


SIGNALS = [signal.SIGKILL, signal.SIGSTOP]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", SIGNALS, ids=["kill-9", "sigstop"])
@pytest.mark.parametrize("stage", ["generation", "reasoner"])
def test_interleaved_stage_fault(umm_faults: TrackedServer, stage: str,
                                 sig: signal.Signals) -> None:
    fault("umm", umm_faults, stage, sig)


def test_interleaved_server_leaves_nothing_behind(umm_faults: TrackedServer) -> None:
    no_orphans_or_temp_files(umm_faults)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", SIGNALS, ids=["kill-9", "sigstop"])
def test_text_chat_reasoner_fault(chat_faults: TrackedServer, sig: signal.Signals) -> None:
    fault("chat", chat_faults, "reasoner", sig)


def test_text_chat_server_leaves_nothing_behind(chat_faults: TrackedServer) -> None:
    no_orphans_or_temp_files(chat_faults)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", SIGNALS, ids=["kill-9", "sigstop"])
def test_direct_video_job_generation_fault(direct_faults: TrackedServer,
                                           sig: signal.Signals) -> None:
    fault("direct", direct_faults, "generation", sig)


def test_direct_server_leaves_nothing_behind(direct_faults: TrackedServer) -> None:
    no_orphans_or_temp_files(direct_faults)
