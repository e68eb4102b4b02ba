"""Where each second of an interleaved request went (``pipeline.timeline``): in the request's
log line, as progress events (``spans``, opt-in) and in ``/metrics``, over HTTP with the scripted
engines (their simulated Reasoner time is ``decode``, their steps ``denoise``, making and encoding
the media ``encode``)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from sglang_omni.pipeline.timeline import Timeline, dispatch_spans
from tests.kit import parse_sse, script, wait_until
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import SMALL, final, image, video

STEP_S, STEPS, THINK_S = 0.05, 4, 0.2
BODY = {"prompt": script(image("a red cube", delay_s=THINK_S), video("it rolls"), final("done")),
        "stage_params": {"generation": {**SMALL, "num_inference_steps": STEPS}}}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", str(STEP_S)) as srv:
        yield srv


def test_dispatch_spans_split_the_dispatch() -> None:
    spans = dispatch_spans({"prefill": 0.2, "decode": 0.5, "bogus": 9.0}, engine_s=1.0,
                           wait_s=0.3, dispatch_s=1.25)
    assert spans == pytest.approx({"prefill": 0.2, "decode": 0.5, "engine": 0.3, "wait": 0.3,
                                   "relay": 0.25})
    timeline = Timeline()
    timeline.add("reasoner", spans)
    timeline.add("reasoner", spans)
    found = timeline.breakdown(wall_s=4.0)
    assert found["reasoner.decode"] == 1.0 and found["server"] == pytest.approx(0.9)
    assert timeline.model_s() == pytest.approx(1.4)


def test_progress_events_say_where_each_dispatch_went(server: Server) -> None:
    with httpx.stream("POST", f"{server.url}/generate", timeout=60,
                      json={**BODY, "stream": True, "include_progress": True}) as resp:
        events = parse_sse(resp.read().decode())
    ended = [p for e, p in events if e == "progress" and "spans" in p]
    assert [(p["stage"], p["turn"]) for p in ended] == [
        ("reasoner", 1), ("generation", 1), ("reasoner", 2), ("generation", 2), ("reasoner", 3)]
    first_turn, image_made, _, video_made, _ = (p["spans"] for p in ended)
    assert first_turn["decode"] >= THINK_S
    assert set(first_turn) == {"decode", "engine", "wait", "relay"}
    for made in (image_made, video_made):
        assert made["denoise"] >= STEPS * STEP_S and made["encode"] > 0
    assert (ended[1]["modality"], ended[1]["step"], ended[1]["steps"]) == ("image", STEPS, STEPS)
    assert (ended[3]["modality"], ended[3]["generation"]) == ("video", 2)
    # each dispatch's end comes before what follows it on the wire
    names = [(e, p.get("kind") if e == "segment" else "spans" in p) for e, p in events]
    assert names.index(("progress", True)) < names.index(("segment", "image"))


def test_the_log_line_and_metrics_carry_the_timeline(server: Server) -> None:
    resp = httpx.post(f"{server.url}/generate", json={**BODY, "rid": "timeline-1"}, timeout=60)
    assert resp.status_code == 200
    assert wait_until(lambda: "rid=timeline-1 " in server.log(), timeout=10)
    line = next(x for x in server.log().splitlines() if "rid=timeline-1 " in x)
    duration = float(re.search(r" duration_s=([\d.]+)", line).group(1))
    raw = re.search(r" timeline=(\S+)", line).group(1)
    timeline = {k: float(v) for k, v in (item.split(":") for item in raw.split(","))}
    assert timeline["reasoner.decode"] >= THINK_S
    assert timeline["generation.denoise"] >= 2 * STEPS * STEP_S
    assert timeline["generation.encode"] > 0 and "server" in timeline
    assert {"reasoner.wait", "reasoner.relay", "generation.relay"} <= set(timeline)
    # the spans account for the whole request, each second once
    assert sum(timeline.values()) == pytest.approx(duration, abs=0.02)
    metrics = httpx.get(f"{server.url}/metrics").text
    for span in ("reasoner.decode", "generation.denoise", "generation.encode", "server"):
        count = re.search(rf'sgl_omni_request_span_seconds_count{{span="{re.escape(span)}"}} '
                          r"([\d.]+)", metrics)
        assert count is not None and float(count.group(1)) >= 1, span


def test_a_wait_for_a_video_still_being_encoded_counts_as_encoding(server: Server) -> None:
    """The time from a video's last frame to its MP4 (here 2 s more: ``!encode-delay``) is the
    generation's ``encode``, never the server's (issue 34)."""
    body = {"prompt": script(video("!encode-delay=2 a slow clip"), final("done")),
            "rid": "timeline-encode", "stage_params": {"generation": SMALL}}
    resp = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert wait_until(lambda: "rid=timeline-encode " in server.log(), timeout=10)
    line = next(x for x in server.log().splitlines() if "rid=timeline-encode " in x)
    raw = re.search(r" timeline=(\S+)", line).group(1)
    timeline = {k: float(v) for k, v in (item.split(":") for item in raw.split(","))}
    assert timeline["generation.encode"] >= 2.0, timeline
    duration = float(re.search(r" duration_s=([\d.]+)", line).group(1))
    assert sum(timeline.values()) == pytest.approx(duration, abs=0.02)
