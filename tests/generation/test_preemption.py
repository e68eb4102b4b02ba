"""The oldest request first at denoising-step granularity, over HTTP with the scripted engines in
real server and stage processes (docs/interleaved.md, "The generation stage serves the oldest
request first").

The scenario: the older request's first generation runs; the younger request's generation queues
behind it (younger: it waits) and starts when the older one returns to its Reasoner; the older
request's second generation, queued while the younger's runs, pauses the younger at its next
step boundary, runs, and the younger resumes. Everything is observed through the product: the
plan (``GET /v1/queue``), the stage's log, ``/metrics`` and the responses.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.kit import metric, wait_until
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import final, image, media_bytes, script

STEP_S = 0.05
OLD_STEPS, YOUNG_STEPS = 160, 100  # 8 s and 5 s on the stage: 8 s for the younger request
# to reach the generation queue (its Reasoner turn) on a loaded machine
HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", str(STEP_S)) as srv:
        yield srv


def body(rid: str, prompt: str, steps: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "rid": rid, **extra, "stage_params": {"generation": {
        "width": 32, "height": 32, "num_inference_steps": steps}}}


def older(rid: str, second: str = "old two") -> dict[str, Any]:
    # its second turn (1.5 s of Reasoner time) lets the younger generation start first
    return body(rid, script(image("old one"), image(second, delay_s=1.5), final("old done")),
                OLD_STEPS)


def younger(rid: str) -> dict[str, Any]:
    return body(rid, script(image("young one"), final("young done")), YOUNG_STEPS)


def phases(server: Server) -> dict[str, str]:
    return {p["rid"]: p["phase"] for p in HTTP.get(f"{server.url}/v1/queue").json()["plan"]}


def preemptions(server: Server) -> float:
    return Scrape(server).value("sgl_omni_generation_preemptions_total", stage="generation")


def image_bytes(resp: httpx.Response) -> bytes:
    assert resp.status_code == 200, resp.text
    segments = [s for s in resp.json()["segments"] if isinstance(s.get("data"), dict)]
    assert len(segments) == 1, segments
    return media_bytes(segments[0])


def start_pair(server: Server, old_rid: str, young: dict[str, Any], post_young: Any = None,
               second: str = "old two") -> tuple[threading.Thread, threading.Thread,
                                                 dict[str, Any], list[str]]:
    """Send the older request, then, while its first generation runs, the younger; return once
    the younger's generation waits behind it."""
    out: dict[str, Any] = {}
    ended: list[str] = []

    def send(rid: str, payload: dict[str, Any]) -> None:
        out[rid] = HTTP.post(f"{server.url}/generate", json=payload)
        ended.append(rid)

    old = threading.Thread(target=send, args=(old_rid, older(old_rid, second)), daemon=True)
    old.start()
    assert wait_until(lambda: phases(server).get(old_rid) == "generating", timeout=30)
    young_rid = young["rid"]
    young_thread = threading.Thread(target=post_young or send, args=(young_rid, young),
                                    daemon=True)
    young_thread.start()
    # younger: it waits for the older one's generation, it does not pause it
    assert wait_until(lambda: phases(server) == {old_rid: "generating", young_rid: "queued"},
                      timeout=30), phases(server)
    return old, young_thread, out, ended


def paused_line(server: Server, rid: str) -> re.Match[str] | None:
    return re.search(rf"request {rid}: paused at step (\d+) of {YOUNG_STEPS} for the older "
                     r"request (\S+) ", server.log())


def test_an_older_generation_pauses_a_younger_one_at_a_step_and_it_resumes_with_its_bytes(
        server: Server) -> None:
    alone = image_bytes(HTTP.post(f"{server.url}/generate", json=younger("young-alone")))
    before = preemptions(server)
    old, young, out, ended = start_pair(server, "old", younger("young"))
    # the older request's second generation starts while the younger's runs, pausing it
    assert wait_until(lambda: phases(server) == {"old": "generating", "young": "paused"},
                      timeout=30), phases(server)
    assert wait_until(lambda: paused_line(server, "young") is not None, timeout=30)
    old.join(60)
    young.join(60)
    assert ended == ["old", "young"]  # the older request finished first
    assert out["old"].status_code == 200, out["old"].text
    assert image_bytes(out["young"]) == alone  # the same bytes as if it had never paused
    paused = paused_line(server, "young")
    assert paused is not None and paused.group(2) == "old"
    step = int(paused.group(1))
    assert 0 < step < YOUNG_STEPS
    assert re.search(rf"request young: resumed at step {step} of {YOUNG_STEPS} after ",
                     server.log())
    assert preemptions(server) == before + 1
    # the paused time is the younger request's generation.paused span (docs/interleaved.md)
    assert Scrape(server).value("sgl_omni_request_span_seconds_count",
                                span="generation.paused") >= 1


def test_a_paused_generation_cancelled_by_its_client_frees_its_state_and_the_older_finishes(
        server: Server) -> None:
    leave = threading.Event()
    status: dict[str, int] = {}

    def stream_until_told(rid: str, payload: dict[str, Any]) -> None:
        with HTTP.stream("POST", f"{server.url}/generate",
                         json={**payload, "stream": True}) as resp:
            status[rid] = resp.status_code
            leave.wait(60)  # then the client leaves: its request is aborted

    aborted = metric(server, "generation", "aborted", default=0)
    old, young, out, _ = start_pair(server, "old-c", younger("young-c"), stream_until_told)
    assert wait_until(lambda: paused_line(server, "young-c") is not None, timeout=30)
    leave.set()
    assert wait_until(lambda: "request young-c: its paused generation ended (cancelled)"
                      in server.log(), timeout=30)
    assert wait_until(lambda: metric(server, "generation", "aborted", default=0)
                      == aborted + 1, timeout=30)
    old.join(60)
    young.join(60)
    assert status["young-c"] == 200
    assert out["old-c"].status_code == 200, out["old-c"].text
    assert wait_until(lambda: phases(server) == {}, timeout=30)


def test_a_stage_exit_ends_a_paused_generation_with_the_error_of_a_running_one() -> None:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", str(STEP_S)) as own:
        # the older request's second generation takes the stage down as it starts, with the
        # younger one paused for it
        old, young, out, _ = start_pair(own, "old-x", younger("young-x"),
                                        second="!crash old two")
        old.join(60)
        young.join(60)
        assert paused_line(own, "young-x") is not None
        for rid in ("old-x", "young-x"):
            resp = out[rid]
            assert resp.status_code == 500, resp.text
            assert "generation stage process exited" in resp.json()["error"]["message"], rid
        # the stage is restarted and serves again
        assert wait_until(lambda: HTTP.get(f"{own.url}/health").status_code == 200, timeout=60)
        again = HTTP.post(f"{own.url}/generate", json=younger("young-again"))
        assert again.status_code == 200, again.text


def test_with_a_pause_budget_of_zero_the_older_generation_waits_for_the_younger_one() -> None:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", str(STEP_S),
                "--generation.factory.pause_budget_bytes", "0") as own:
        old, young, out, ended = start_pair(own, "old-z", younger("young-z"))
        assert wait_until(lambda: phases(own) == {"old-z": "queued", "young-z": "generating"},
                          timeout=30), phases(own)  # the older one's second generation waits
        old.join(60)
        young.join(60)
        assert ended == ["young-z", "old-z"]
        assert out["old-z"].status_code == 200 and out["young-z"].status_code == 200
        assert paused_line(own, "young-z") is None
        assert preemptions(own) == 0
