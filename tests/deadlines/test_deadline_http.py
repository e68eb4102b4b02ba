"""Deadline planning through HTTP with the scripted engines, small timeout_s and step_time_s.

Each test starts its own server, because measured times are server state. A first request
measures an image at about 1 s (4 steps of 0.25 s) before the scenario runs.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.kit import metric, wait_until
from tests.kit import script as kit_script
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server

SMALL = {"width": 32, "height": 32}


def planned_server(timeout_s: float) -> Server:
    return Server(*SCRIPTED_UMM, "--orchestrator.factory.timeout_s", str(timeout_s),
                  "--generation.factory.step_time_s", "0.25")


def script(*entries: dict[str, Any]) -> str:
    return kit_script(*entries, tail="")


def generate(server: Server, prompt: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{server.url}/generate", timeout=timeout,
                      json={"prompt": prompt, "stage_params": {"generation": SMALL}})


def measure(server: Server, first_turn_delay: float = 0.0) -> None:
    resp = generate(server, script({"action": "image", "prompt": "measure",
                                    "delay_s": first_turn_delay},
                                   {"action": "final", "text": "ok"}))
    assert resp.status_code == 200, resp.text


def plan(server: Server) -> list[dict[str, Any]]:
    """The requests ``/v1/queue`` has planned."""
    return httpx.get(f"{server.url}/v1/queue", timeout=10).json()["plan"]


def aborted(server: Server) -> float:
    return metric(server, "generation", "aborted")


def refusals(server: Server, reason: str) -> float:
    """``sgl_omni_admission_refusals_total{reason}`` (docs/operations.md)."""
    return Scrape(server).value("sgl_omni_admission_refusals_total", reason=reason)


def test_refused_when_an_idle_server_would_plan_more() -> None:
    with planned_server(12) as server:
        measure(server)  # image ~1 s, Reasoner turn ~0 s: an idle server plans all 8
        busy: dict = {}
        eight = script(*({"action": "image", "prompt": f"p{i}"} for i in range(8)),
                       {"action": "final", "text": "done"})
        thread = threading.Thread(target=lambda: busy.update(resp=generate(server, eight)))
        thread.start()
        # the busy request is admitted, holding ~7.5 s of planned generations
        assert wait_until(lambda: len(plan(server)) == 1, timeout=30), plan(server)
        refused = generate(server, "hello")
        assert refused.status_code == 503, refused.text
        assert "retry later" in refused.json()["error"]["message"]
        assert refusals(server, "plan") == 1
        thread.join(60)
        assert busy["resp"].status_code == 200
        assert [s["kind"] for s in busy["resp"].json()["segments"]] == ["image"] * 8 + ["text"]
        assert generate(server, "hello").status_code == 200  # idle again


def test_no_time_left_receipt_reaches_the_reasoner() -> None:
    with planned_server(12) as server:
        measure(server)
        # the first image takes ~6 s: a longer time, so at ~6 s another image (6 s) and the
        # final turn no longer fit before the 12 s deadline
        resp = generate(server, script({"action": "image", "prompt": "!sleep=5 slow"},
                                       {"action": "image", "prompt": "one more"},
                                       {"action": "final", "text": "{last}"}))
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert [s["kind"] for s in body["segments"]] == ["image", "text"]
        assert body["text"].startswith("Receipt: no time is left for another generation")


def test_fail_fast_503_cancels_the_generation() -> None:
    with planned_server(12) as server:
        measure(server, first_turn_delay=3)  # Reasoner turn measured at ~3 s
        before = aborted(server)
        resp = generate(server, script({"action": "image", "prompt": "!sleep=30 stuck"},
                                       {"action": "final", "text": "never"}))
        # 503 "retry later" as the plan broke, not the 504 of timeout_s (12 s) ending it
        assert resp.status_code == 503, resp.text
        message = resp.json()["error"]["message"]
        assert "retry later" in message, message
        assert refusals(server, "deadline") == 1 and refusals(server, "plan") == 0
        wait_until(lambda: aborted(server) >= before + 1, timeout=5)
        assert aborted(server) == before + 1


def test_the_next_generation_waits_until_an_aborted_one_has_ended_on_the_stage() -> None:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", "0.1") as server:
        hold = script({"action": "image", "prompt": "!sleep=60 !abort-delay=3 held"},
                      {"action": "final", "text": "never"})
        client = httpx.Client(timeout=60)
        stream = client.stream("POST", f"{server.url}/generate", json={
            "prompt": hold, "stream": True, "stage_params": {"generation": SMALL}})
        stream.__enter__()

        def phases() -> list[str]:
            return [p["phase"] for p in httpx.get(f"{server.url}/v1/queue").json()["plan"]]

        assert wait_until(lambda: phases() == ["generating"])
        waiting: dict = {}
        queued = threading.Thread(target=lambda: waiting.update(resp=generate(
            server, script({"action": "image", "prompt": "next"},
                           {"action": "final", "text": "ok"}))))
        queued.start()
        assert wait_until(lambda: phases() == ["generating", "queued"])
        stream.__exit__(None, None, None)  # the client leaves: its generation is aborted
        client.close()
        time.sleep(1.0)
        # The stage is still ending the aborted job (3 s): the next generation has not started.
        now = phases()  # a stage found stalled and restarted ends both: its log says so
        assert now == ["generating", "queued"], (now, waiting, server.log()[-4000:])
        assert aborted(server) == 0
        queued.join(30)
        assert waiting["resp"].status_code == 200
        assert aborted(server) == 1


def test_steps_beyond_what_fits_are_refused_up_front_not_timed_out() -> None:
    """A request asking for more denoising steps than were measured is planned at the measured
    time per step (the stage reports the 4 steps it ran by default): 100 steps of 0.25 s cannot
    finish in timeout_s 12, so it gets 503 saying to ask for fewer, at once, instead of holding
    the stage until its deadline and ending with 504."""
    with planned_server(12) as server:
        measure(server)
        submitted = metric(server, "generation", "submitted")
        image = script({"action": "image", "prompt": "many steps"}, {"action": "final",
                                                                      "text": "never"})
        resp = httpx.post(f"{server.url}/generate", timeout=60, json={
            "prompt": image, "stage_params": {"generation": {**SMALL,
                                                             "num_inference_steps": 100}}})
        assert resp.status_code == 503, resp.text
        message = resp.json()["error"]["message"]
        assert "100 denoising steps" in message and "fewer num_inference_steps" in message
        assert refusals(server, "plan") == 1
        # up front: the generation stage never saw it
        assert metric(server, "generation", "submitted") == submitted
        # 12 steps (3 s) fit: planned at 3 s, run and answered
        resp = httpx.post(f"{server.url}/generate", timeout=60, json={
            "prompt": image.replace("never", "ok"),
            "stage_params": {"generation": {**SMALL, "num_inference_steps": 12}}})
        assert resp.status_code == 200, resp.text
        assert httpx.get(f"{server.url}/v1/queue").json()["measured"]["longest_s"]["image"] \
            > 2.9
