"""The direct image and action routes are admitted like every other route, over HTTP: at most
``server.max_direct_queue`` queued or running (503 with Retry-After for the next, before any
work), waiting bounded by ``server.direct_wait_s`` (503 with Retry-After past it), and a request
the queue ahead would keep waiting longer, at the measured time per request, refused at once.
Before, every request became a stage job at once and waited as long as the queue made it."""

from __future__ import annotations

import re
import time

import httpx

from tests.generation.kit import scripted_server
from tests.server import Server
from tests.supervision.kit import InFlight, wait_jobs

DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


def image(server: Server, prompt: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/images/generations",
                      json={"prompt": prompt, "size": "32x32"}, timeout=60)


def action(server: Server) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/actions/generations",
                      json={"input": {"task": "t"}, "parameters": DROID}, timeout=60)


def refusals(server: Server, reason: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(rf'^sgl_omni_admission_refusals_total\{{reason="{reason}"\}} (\S+)$',
                      text, re.M)
    return float(match[1]) if match else 0.0


def unavailable(resp: httpx.Response, says: str) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] == "5"
    assert says in resp.json()["error"]["message"], resp.text


def test_a_full_queue_refuses_at_once() -> None:
    with scripted_server("--server.max_direct_queue", "1") as server:
        running = InFlight(lambda: image(server, "!sleep=30 cube"))
        wait_jobs(server, "generation", 1)
        unavailable(image(server, "cube"), "server.max_direct_queue 1")
        unavailable(action(server), "server.max_direct_queue 1")
        assert refusals(server, "direct_queue") == 2  # refused on entry, not after waiting
        assert running.error is None and running.result is None  # still running


def test_waiting_is_bounded_then_planned() -> None:
    with scripted_server("--server.direct_wait_s", "1") as server:
        first = InFlight(lambda: image(server, "!sleep=4 cube"))
        wait_jobs(server, "generation", 1)
        started = time.monotonic()
        unavailable(image(server, "cube"), "server.direct_wait_s")  # waited its 1 s
        assert time.monotonic() - started >= 1
        assert refusals(server, "direct_wait") == 1
        assert first.wait().status_code == 200  # the queue measured a 4 s request
        second = InFlight(lambda: image(server, "!sleep=30 cube"))
        wait_jobs(server, "generation", 2)
        unavailable(action(server), "longer than server.direct_wait_s")
        assert refusals(server, "direct_plan") == 1  # planned on entry, not after waiting
        assert refusals(server, "direct_wait") == 1
        assert second.error is None and second.result is None
