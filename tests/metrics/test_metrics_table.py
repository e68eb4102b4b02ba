"""Every metric of docs/operations.md's table, asserted after a scripted workload: the table, the
checks below and the families ``/metrics`` exposes are the same set, so none can drift.

The workload: interleaved requests streaming and not (an image, a video, chat media fetched from
a loopback host), refusals (400, 404 model, 503 over max_active), a stream that fails after its
200, a client that leaves, requests in flight (scraped meanwhile), and text-only chat over its
admission sum. The planner's ``plan`` and ``deadline`` refusals are asserted in
tests/deadlines, ``stage_down`` in tests/startup, restarts counted up in tests/supervision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.kit import script, wait_until
from tests.media.media_http_server import PNG, MediaServer, serving
from tests.metrics.kit import Scrape, family_name, table
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server
from tests.umm.kit import SMALL, final, image, video

HTTP = httpx.Client(timeout=60)
GEN = {"stage_params": {"generation": SMALL}}


@pytest.fixture(scope="module")
def media_host() -> Iterator[MediaServer]:
    with serving() as host:
        yield host


def generate(server: Server, prompt: str, **extra: Any) -> httpx.Response:
    return HTTP.post(f"{server.url}/generate", json={"prompt": prompt, **GEN, **extra})


def in_background(call: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def scrapes(media_host: MediaServer) -> dict[str, Scrape]:
    """Run the workload; the scrapes taken during it and after it."""
    out: dict[str, Scrape] = {}
    with Server(*SCRIPTED_UMM, "--orchestrator.factory.max_active", "2",
                "--generation.factory.step_time_s", "0.02",
                "--allowed-media-domain", "127.0.0.1") as umm:
        chat_image = f"http://127.0.0.1:{media_host.port}/ok.png"
        body = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": script(image("a"), video("b"), final("c"))},
            {"type": "image_url", "image_url": {"url": chat_image}}]}], **GEN}
        with HTTP.stream("POST", f"{umm.url}/generate", json={**body, "stream": True}) as resp:
            assert resp.status_code == 200 and "[DONE]" in resp.read().decode()
        assert generate(umm, script(image("a"), final("b"))).status_code == 200
        assert generate(umm, "x", temperature="hot").status_code == 400
        assert generate(umm, "x", model="not-served").status_code == 404
        with HTTP.stream("POST", f"{umm.url}/generate", json={
                "prompt": script(image("!no-media")), "stream": True, **GEN}) as resp:
            assert "event: error" in resp.read().decode()
        with HTTP.stream("POST", f"{umm.url}/generate", json={
                "prompt": script(image("!sleep=3 left")), "stream": True,
                "include_progress": True, **GEN}) as resp:
            for line in resp.iter_lines():  # until the generation runs; then the client leaves
                if '"stage": "generation"' in line:
                    break
        refused = HTTP.post(f"{umm.url}/generate", json={"prompt": "look", **GEN, "images": [
            "http://example.com/x.png"]})
        assert refused.status_code == 400
        missing = HTTP.post(f"{umm.url}/generate", json={"prompt": "look", **GEN, "images": [
            f"http://127.0.0.1:{media_host.port}/missing"]})
        assert missing.status_code == 400  # the server fetches it once: no stage job ran
        refusal = generate(umm, script({"error": {"status": 400, "message": "refused"}}))
        assert refusal.status_code == 400  # a Reasoner job that fails
        # two requests in flight, the second's generation queued behind the first's
        first = in_background(lambda: generate(umm, script(image("!sleep=2 slow"), final("a"))))
        assert wait_until(lambda: [p["phase"] for p in HTTP.get(f"{umm.url}/v1/queue").json()[
            "plan"]] == ["generating"], timeout=10)  # its generation runs
        second = in_background(lambda: generate(umm, script(image("next"), final("b"))))
        assert wait_until(lambda: Scrape(umm).value("sgl_omni_queue_depth") == 1, timeout=10)
        out["during"] = Scrape(umm)
        over = generate(umm, "a third")
        assert over.status_code == 503 and "max_active" in over.json()["error"]["message"]
        first.join(30)
        second.join(30)
        assert wait_until(lambda: Scrape(umm).value("sgl_omni_media_fetches_total") >= 1
                          and Scrape(umm).value("sgl_omni_media_refusals_total",
                                                reason="not_found") >= 1
                          and Scrape(umm).total("sgl_omni_stage_request_media_bytes") == 0
                          and Scrape(umm).value("sgl_omni_request_states") == 0,
                          timeout=10)
        out["after"] = Scrape(umm)
    with Server(*SCRIPTED_CHAT, "--reasoner.engine.max_running_requests", "1",
                "--reasoner.engine.max_queued_requests", "1") as chat:
        slow = {"messages": [{"role": "user", "content": script(final("ok", delay_s=2))}]}
        held = [in_background(lambda: HTTP.post(f"{chat.url}/v1/chat/completions", json=slow))
                for _ in range(2)]
        # both are on the stage, one running and one in its queue
        assert wait_until(lambda: Scrape(chat).value("sgl_omni_stage_jobs_total",
                                                     stage="reasoner", outcome="submitted") == 2)
        assert HTTP.post(f"{chat.url}/v1/chat/completions", json=slow).status_code == 503
        for thread in held:
            thread.join(30)
        out["chat"] = Scrape(chat)
    return out


def _requests(s: dict[str, Scrape]) -> None:
    after = s["after"]
    for status in ("200", "400", "404", "500", "499", "503"):
        assert after.value("sgl_omni_requests_total", route="/generate", status=status) >= 1, \
            status
    assert after.value("sgl_omni_requests_total", route="/health", status="200") >= 1


def _duration(s: dict[str, Scrape]) -> None:
    assert s["after"].value("sgl_omni_request_duration_seconds_count", route="/generate") >= 9
    assert s["after"].value("sgl_omni_request_duration_seconds_sum", route="/generate") > 2


def _first_segment(s: dict[str, Scrape]) -> None:
    count = s["after"].value("sgl_omni_time_to_first_segment_seconds_count", route="/generate")
    assert count >= 4  # the stream, the plain request and the two in flight


def _active(s: dict[str, Scrape]) -> None:
    assert s["during"].value("sgl_omni_active_requests") >= 2
    assert s["after"].value("sgl_omni_active_requests") == 0


def _turns(s: dict[str, Scrape]) -> None:
    assert s["after"].value("sgl_omni_reasoner_turn_seconds_count") >= 9


def _spans(s: dict[str, Scrape]) -> None:
    after = s["after"]
    # one observation per span of each interleaved request that ended (refused ones have none)
    assert after.value("sgl_omni_request_span_seconds_count", span="server") >= 4
    assert after.value("sgl_omni_request_span_seconds_count", span="generation.denoise") >= 4
    assert after.value("sgl_omni_request_span_seconds_sum", span="generation.denoise") > 0
    assert after.value("sgl_omni_request_span_seconds_count", span="reasoner.relay") >= 4


def _generations(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_generation_seconds_count", modality="image") >= 4
    assert after.value("sgl_omni_generation_seconds_count", modality="video") == 1
    assert after.value("sgl_omni_generation_seconds_sum", modality="image") > 2  # the !sleep=2


def _queue(s: dict[str, Scrape]) -> None:
    assert s["during"].value("sgl_omni_queue_depth") == 1
    assert s["after"].value("sgl_omni_queue_depth") == 0


def _interleaved(s: dict[str, Scrape]) -> None:
    assert s["during"].value("sgl_omni_interleaved_requests") == 2
    assert s["after"].value("sgl_omni_interleaved_requests") == 0


def _request_states(s: dict[str, Scrape]) -> None:
    assert s["during"].value("sgl_omni_request_states") == 2  # the two requests in flight
    assert s["after"].value("sgl_omni_request_states") == 0


def _finished_in_memory(s: dict[str, Scrape]) -> None:
    # every finished request freed, the client that left included (its stream's close no
    # longer races its iteration); tests/reliability/test_finished_freed.py checks the same
    # with the cyclic collector off.
    assert s["after"].value("sgl_omni_finished_requests_in_memory") == 0


def _longest(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_planner_longest_seconds", kind="image") > 2
    assert after.value("sgl_omni_planner_longest_seconds", kind="video") > 0
    assert after.labels("sgl_omni_planner_longest_seconds", "kind") == {"reasoner", "image",
                                                                         "video"}


def _shortest(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert 0 < after.value("sgl_omni_planner_shortest_seconds", kind="image") < 2
    assert after.labels("sgl_omni_planner_shortest_seconds", "kind") == {"image", "video"}


def _refusals(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_admission_refusals_total", reason="max_active") == 1
    assert after.labels("sgl_omni_admission_refusals_total", "reason") == {
        "max_active", "plan", "deadline", "stage_down", "chat_queue", "body_budget",
        "direct_queue", "direct_plan", "direct_wait", "media_budget"}
    assert s["chat"].value("sgl_omni_admission_refusals_total", reason="chat_queue") == 1


def _pending_body(s: dict[str, Scrape]) -> None:
    # bodies are held only while read and parsed (tests/wire/test_body_budget.py holds one)
    assert s["during"].value("sgl_omni_pending_body_bytes") >= 0
    assert s["after"].value("sgl_omni_pending_body_bytes") == 0


def _client_media(s: dict[str, Scrape]) -> None:
    # the chat image's reservation ends with its request (tests/media_http/test_media_budget.py)
    assert s["during"].value("sgl_omni_client_media_bytes") >= 0
    assert s["after"].value("sgl_omni_client_media_bytes") == 0


def _retained(s: dict[str, Scrape]) -> None:
    assert s["during"].value("sgl_omni_retained_bytes") > 0
    assert s["after"].value("sgl_omni_retained_bytes") == 0


def _fetches(s: dict[str, Scrape]) -> None:
    assert s["after"].value("sgl_omni_media_fetches_total") == 1  # the chat image, once


def _fetched_bytes(s: dict[str, Scrape]) -> None:
    assert s["after"].value("sgl_omni_media_fetched_bytes_total") == len(PNG)


def _media_refusals(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_media_refusals_total", reason="policy") == 1
    assert after.value("sgl_omni_media_refusals_total", reason="not_found") == 1


def _stage_up(s: dict[str, Scrape]) -> None:
    for stage in ("reasoner", "generation"):
        assert s["after"].value("sgl_omni_stage_up", stage=stage) == 1


def _stage_jobs(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_stage_jobs_total", stage="generation", outcome="completed") >= 5
    assert after.value("sgl_omni_stage_jobs_total", stage="generation", outcome="aborted") == 1
    assert after.value("sgl_omni_stage_jobs_total", stage="reasoner", outcome="failed") == 1
    for stage in ("reasoner", "generation"):  # every job sent was taken by its engine
        jobs = {o: after.value("sgl_omni_stage_jobs_total", stage=stage, outcome=o)
                for o in ("submitted", "started")}
        assert jobs["started"] == jobs["submitted"] > 0, (stage, jobs)


def _restarts(s: dict[str, Scrape]) -> None:
    for stage in ("reasoner", "generation"):
        assert s["after"].value("sgl_omni_stage_restarts_total", stage=stage) == 0


def _stage_failed_requests(s: dict[str, Scrape]) -> None:
    for stage in ("reasoner", "generation"):  # no stage died
        assert s["after"].value("sgl_omni_stage_failed_requests_total", stage=stage) == 0
def _preemptions(s: dict[str, Scrape]) -> None:
    # none here: no older request's generation queued while a younger one's ran
    # (tests/generation/test_preemption.py counts them)
    assert s["after"].labels("sgl_omni_generation_preemptions_total", "stage") == {"generation"}
    assert s["after"].value("sgl_omni_generation_preemptions_total", stage="generation") == 0


def _sent_bytes(s: dict[str, Scrape]) -> None:
    after = s["after"]
    # the Reasoner got the chat image once (tests/umm/test_request_media.py bounds the rest)
    assert after.value("sgl_omni_stage_sent_bytes_total", stage="reasoner") > len(PNG)
    assert after.value("sgl_omni_stage_sent_bytes_total", stage="generation") > 0
    assert s["during"].value("sgl_omni_stage_sent_bytes_total", stage="reasoner") \
        < after.value("sgl_omni_stage_sent_bytes_total", stage="reasoner")


def _request_media(s: dict[str, Scrape]) -> None:
    # held while a request runs (tests/umm/test_request_media.py), none once all ended
    assert s["after"].labels("sgl_omni_stage_request_media_bytes", "stage") == {
        "reasoner", "generation"}
    assert s["after"].total("sgl_omni_stage_request_media_bytes") == 0


def _job_seconds(s: dict[str, Scrape]) -> None:
    after = s["after"]
    assert after.value("sgl_omni_stage_job_seconds_count", stage="generation",
                       outcome="completed") >= 5
    assert after.value("sgl_omni_stage_job_seconds_count", stage="generation",
                       outcome="aborted") == 1
    assert after.value("sgl_omni_stage_job_seconds_count", stage="reasoner",
                       outcome="failed") == 1


def _context_gauge(s: dict[str, Scrape]) -> None:
    # The scripted Reasoner keeps no context; tests/hf/test_hf_server.py scrapes the hf one.
    assert s["after"].labels("sgl_omni_reasoner_context_bytes", "stage") == {"reasoner"}
    assert s["after"].value("sgl_omni_reasoner_context_bytes", stage="reasoner") == 0


def _context_counter(name: str, label: str, values: set[str]) -> Callable[[dict[str, Scrape]],
                                                                           None]:
    def check(s: dict[str, Scrape]) -> None:
        assert s["after"].labels(name, label) == values
        assert s["after"].total(name, stage="reasoner") == 0

    return check


EXPECT: dict[str, Callable[[dict[str, Scrape]], None]] = {
    "sgl_omni_requests_total": _requests,
    "sgl_omni_request_duration_seconds": _duration,
    "sgl_omni_time_to_first_segment_seconds": _first_segment,
    "sgl_omni_active_requests": _active,
    "sgl_omni_reasoner_turn_seconds": _turns,
    "sgl_omni_generation_seconds": _generations,
    "sgl_omni_request_span_seconds": _spans,
    "sgl_omni_queue_depth": _queue,
    "sgl_omni_interleaved_requests": _interleaved,
    "sgl_omni_request_states": _request_states,
    "sgl_omni_finished_requests_in_memory": _finished_in_memory,
    "sgl_omni_planner_longest_seconds": _longest,
    "sgl_omni_planner_shortest_seconds": _shortest,
    "sgl_omni_admission_refusals_total": _refusals,
    "sgl_omni_pending_body_bytes": _pending_body,
    "sgl_omni_retained_bytes": _retained,
    "sgl_omni_client_media_bytes": _client_media,
    "sgl_omni_media_fetches_total": _fetches,
    "sgl_omni_media_fetched_bytes_total": _fetched_bytes,
    "sgl_omni_media_refusals_total": _media_refusals,
    "sgl_omni_stage_up": _stage_up,
    "sgl_omni_stage_jobs_total": _stage_jobs,
    "sgl_omni_stage_restarts_total": _restarts,
    "sgl_omni_stage_failed_requests_total": _stage_failed_requests,
    "sgl_omni_stage_job_seconds": _job_seconds,
    "sgl_omni_generation_preemptions_total": _preemptions,
    "sgl_omni_stage_sent_bytes_total": _sent_bytes,
    "sgl_omni_stage_request_media_bytes": _request_media,
    "sgl_omni_reasoner_context_bytes": _context_gauge,
    "sgl_omni_reasoner_context_media_total": _context_counter(
        "sgl_omni_reasoner_context_media_total", "outcome", {"hit", "miss"}),
    "sgl_omni_reasoner_context_evictions_total": _context_counter(
        "sgl_omni_reasoner_context_evictions_total", "stage", {"reasoner"}),
    "sgl_omni_reasoner_prompt_tokens_total": _context_counter(
        "sgl_omni_reasoner_prompt_tokens_total", "source", {"reused", "prefilled"}),
}


def test_the_table_the_checks_and_the_server_name_the_same_metrics(
        scrapes: dict[str, Scrape]) -> None:
    documented = table()
    assert set(documented) == set(EXPECT)
    exposed = {name for name in scrapes["after"].families if name.startswith("sgl_omni_")}
    assert exposed == {family_name(m) for m in documented}
    for name, (kind, labels) in documented.items():
        family = scrapes["after"].families[family_name(name)]
        assert family.type == kind, name
        sample_labels = {k for s in family.samples for k in s.labels if k != "le"}
        assert sample_labels == set(labels), name


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_metric(scrapes: dict[str, Scrape], name: str) -> None:
    EXPECT[name](scrapes)
