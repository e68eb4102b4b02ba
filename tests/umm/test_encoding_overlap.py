"""A generated video's MP4 is encoded beside the next Reasoner turn (issue 25): the turn starts
on the Reasoner's copy before the client's MP4 is done, and the segments still go out once each,
numbered in order, the video before everything after it. The scripted generator's
``!encode-delay=S`` stands in for a slow x264."""

from __future__ import annotations

import json
from typing import Any

import httpx

from sglang_omni.engines.synth_media import encode_mp4, frame_pixels
from sglang_omni.media.encode import READER_PRESET, VideoEncoding
from tests.server import Server
from tests.umm.kit import (
    SMALL,
    counts,
    final,
    media_bytes,
    only,
    parse_sse,
    script,
    segments_of,
    sha256,
    stream_generate,
    video,
    wait_for,
)

SLOW_CLIP = "!encode-delay=2 a slow clip"


def clip_frames(prompt: str) -> list[Any]:
    return [frame_pixels(prompt, 0, SMALL["width"], SMALL["height"], i)
            for i in range(SMALL["num_frames"])]


def reasoner_turn(event: str, data: Any, turn: int) -> bool:
    return event == "progress" and data.get("stage") == "reasoner" and data.get("turn") == turn


def test_the_next_turn_starts_before_the_mp4_and_the_segments_keep_their_order(
        server: Server) -> None:
    before = counts(server)
    body = {"prompt": script(video(SLOW_CLIP), final("saw {media}")), "include_progress": True,
            "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    turn_two = next(i for i, (e, d) in enumerate(events) if reasoner_turn(e, d, 2))
    first_segment = next(i for i, (e, _) in enumerate(events) if e == "segment")
    assert turn_two < first_segment  # the turn began while the MP4 was still being encoded
    segments = segments_of(events)
    assert [(s["segment_index"], s["kind"]) for s in segments] == [(0, "video"), (1, "text")]
    assert [e for e, _ in events if e != "progress"] == ["segment", "segment", "complete",
                                                         "message"]
    frames = clip_frames(SLOW_CLIP)
    assert media_bytes(segments[0]) == encode_mp4(frames, 24,
                                                  encoding=VideoEncoding("medium", 8))
    copy = encode_mp4(frames, 24, encoding=VideoEncoding(READER_PRESET, 8))
    assert segments[1]["data"] == "saw " + json.dumps([{"kind": "video",
                                                        "sha256": sha256(copy)}])
    after = counts(server)
    assert after["generation", "completed"] - before["generation", "completed"] == 1
    assert after["generation", "aborted"] - before["generation", "aborted"] == 0


def test_an_oversized_mp4_still_fails_the_request_after_the_turn_began(server: Server) -> None:
    body = {"prompt": script(video("!oversize !encode-delay=1 big"), final("never shown")),
            "include_progress": True, "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    assert any(reasoner_turn(e, d, 2) for e, d in events)
    assert segments_of(events) == []  # not the answer, which came after the video
    (error,) = [d for e, d in events if e == "error"]
    assert "over the 8 MiB inline limit" in error["message"], error


def test_a_client_gone_during_the_encode_aborts_it(server: Server) -> None:
    before = counts(server)
    body = {"prompt": script(video("!encode-delay=30 endless"), final("never")),
            "include_progress": True, "stream": True, "stage_params": {"generation": SMALL}}
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate", json=body) as resp:
        assert resp.status_code == 200
        seen = ""
        for chunk in resp.iter_text():
            seen += chunk
            if any(reasoner_turn(e, d, 2) for e, d in parse_sse(seen.rpartition("\n\n")[0])):
                break  # the encode is running: go away
    wait_for(lambda: counts(server)["generation", "aborted"]
             - before["generation", "aborted"] == 1)
    after = counts(server)
    assert after["generation", "completed"] - before["generation", "completed"] == 0


def test_a_turn_that_fails_during_the_encode_still_gets_the_video_first(server: Server) -> None:
    refusal = {"error": {"status": 400, "message": "the Reasoner refused this turn"}}
    body = {"prompt": script(video("!encode-delay=1 refused next"), refusal),
            "include_progress": True, "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    assert [e for e, _ in events if e != "progress"] == ["segment", "error", "message"]
    (segment,) = segments_of(events)
    assert segment["kind"] == "video" and segment["segment_index"] == 0
    assert "the Reasoner refused this turn" in only(events, "error")["message"]



def test_the_client_mp4_is_encoded_beside_the_reasoner_copy(server: Server) -> None:
    """Both encodes are under way at once (each held by its scripted delay, logged as it
    starts): the client's MP4 does not start after the copy is done."""
    before = counts(server)
    body = {"prompt": script(video("!reader-delay=30 !encode-delay=30 side by side"),
                             final("never")),
            "include_progress": True, "stream": True, "stage_params": {"generation": SMALL}}
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", f"{server.url}/generate", json=body) as resp:
        assert resp.status_code == 200
        wait_for(lambda: "the Reasoner's copy takes 30 s more" in server.log()
                 and "the MP4 takes 30 s more" in server.log(), timeout=25)
    wait_for(lambda: counts(server)["generation", "aborted"]
             - before["generation", "aborted"] == 1)
