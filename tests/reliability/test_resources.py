"""1,000 aborted streams and 1,000 completed requests leave no trace: open fds of the server
and its stages and the server's temp files back to their baseline, server RSS within
baseline + 50 MB, no request state left (``sgl_omni_request_states`` 0)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.kit import no_request_states
from tests.reliability.kit import SMALL, TrackedServer, fds_and_rss, healthy, script

COMPLETED = 1000
ABORTED = 1000
CLIENTS = 16
FD_SLACK = 4  # connections the server may still be closing
RSS_SLACK = 50 * 2**20
STREAM_DEADLINE_S = 30  # a stream that sends no segment for this long is stuck
GEN = {"generation": {**SMALL, "num_inference_steps": 1}}
ONE_IMAGE = script({"action": "image", "prompt": "a"}, {"action": "final", "text": "ok"})
# Aborted in a Reasoner turn (after the headers) or in the second generation (after a segment).
IN_TURN = script({"action": "final", "text": "late", "delay_s": 0.3})
IN_GENERATION = script({"action": "image", "prompt": "first"},
                       {"action": "image", "prompt": "!sleep=0.3 second"},
                       {"action": "final", "text": "late"})


def complete(http: httpx.Client, url: str, i: int) -> str | None:
    if i % 2:
        resp = http.post(f"{url}/generate", json={"prompt": ONE_IMAGE, "stage_params": GEN})
    else:
        resp = http.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": ONE_IMAGE}], "stage_params": GEN})
    return None if resp.status_code == 200 else f"{resp.status_code} {resp.text[:200]}"


def abort(http: httpx.Client, url: str, i: int) -> str | None:
    prompt = IN_TURN if i % 2 else IN_GENERATION
    with http.stream("POST", f"{url}/generate", json={
            "prompt": prompt, "stage_params": GEN, "stream": True}) as resp:
        if resp.status_code != 200:
            return f"{resp.status_code} {resp.read()[:200]!r}"
        if prompt is IN_GENERATION:
            deadline = time.monotonic() + STREAM_DEADLINE_S
            for line in resp.iter_lines():  # keep-alive comments bound the wait for a line
                if line.startswith("event: segment"):
                    break
                if time.monotonic() > deadline:
                    return f"no segment within {STREAM_DEADLINE_S} s: the stream hangs"
    return None  # leaving the block closes the connection mid-stream


def run(url: str, count: int, one: object) -> list[str]:
    def client(c: int) -> list[str]:
        problems = []
        with httpx.Client(timeout=60) as http:
            for i in range(c, count, CLIENTS):
                try:
                    problem = one(http, url, i)  # type: ignore[operator]
                except httpx.HTTPError as exc:
                    problem = repr(exc)
                if problem:
                    problems.append(problem)
        return problems

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [p for found in pool.map(client, range(CLIENTS)) for p in found]


def settle(server: TrackedServer, fds: int, temp: list[str], timeout: float = 20) -> tuple:
    """Wait (bounded) for fds and temp files to come back; the last (fds, rss, temp files)."""
    deadline = time.monotonic() + timeout
    while True:
        now_fds, rss = fds_and_rss(server)
        now_temp = server.temp_files()
        if (now_fds <= fds + FD_SLACK and now_temp == temp) or time.monotonic() > deadline:
            return now_fds, rss, now_temp
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_aborted_and_completed_requests_leave_no_trace(umm: TrackedServer) -> None:
    assert run(umm.url, 48, complete) == [] and run(umm.url, 48, abort) == []  # warm up
    base_fds, base_rss, base_temp = settle(umm, 10**6, umm.temp_files(), 0)
    failed = run(umm.url, COMPLETED, complete)
    aborted = run(umm.url, ABORTED, abort)
    fds, rss, temp = settle(umm, base_fds, base_temp)
    print(f"fds {base_fds} -> {fds}, RSS {base_rss / 2**20:.1f} -> {rss / 2**20:.1f} MiB, "
          f"temp files {len(base_temp)} -> {len(temp)}")
    assert healthy(umm.server)
    assert no_request_states(umm.server) is None  # every request's state was released
    assert failed == [], f"{len(failed)} of {COMPLETED} requests failed, e.g. {failed[:5]}"
    assert aborted == [], f"{len(aborted)} of {ABORTED} streams were refused, e.g. {aborted[:5]}"
    assert fds <= base_fds + FD_SLACK, f"open fds {base_fds} -> {fds}"
    assert temp == base_temp, f"temp files left: {sorted(set(temp) - set(base_temp))[:20]}"
    assert rss <= base_rss + RSS_SLACK, f"server RSS {base_rss / 2**20:.0f} MiB -> " \
        f"{rss / 2**20:.0f} MiB"
