"""A generated video's one MP4 (issue 34): encoded as its frames are made, it is both the
client's segment and what the next Reasoner turn reads, so that turn starts once the MP4 is
done. The scripted generator's ``!encode-delay=S`` stands in for a slow x264 (S seconds after
the last frame)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from sglang_omni.engines.synth_media import encode_mp4, frame_pixels
from sglang_omni.media.encode import VideoEncoding
from tests.server import Server
from tests.umm.kit import (
    SMALL,
    counts,
    final,
    media_bytes,
    only,
    script,
    segments_of,
    sha256,
    stream_generate,
    video,
    wait_for,
)

SLOW_CLIP = "!encode-delay=1 a slow clip"


def clip_frames(prompt: str) -> list[Any]:
    return [frame_pixels(prompt, 0, SMALL["width"], SMALL["height"], i)
            for i in range(SMALL["num_frames"])]


def reasoner_turn(event: str, data: Any, turn: int) -> bool:
    return event == "progress" and data.get("stage") == "reasoner" and data.get("turn") == turn


def test_the_next_turn_reads_the_finished_mp4_the_client_gets(server: Server) -> None:
    before = counts(server)
    body = {"prompt": script(video(SLOW_CLIP), final("saw {media}")), "include_progress": True,
            "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    turn_two = next(i for i, (e, d) in enumerate(events) if reasoner_turn(e, d, 2))
    first_segment = next(i for i, (e, _) in enumerate(events) if e == "segment")
    assert first_segment < turn_two  # the video went out before the turn that reads it
    segments = segments_of(events)
    assert [(s["segment_index"], s["kind"]) for s in segments] == [(0, "video"), (1, "text")]
    client = media_bytes(segments[0])
    assert client == encode_mp4(clip_frames(SLOW_CLIP), 24, encoding=VideoEncoding())
    assert segments[1]["data"] == "saw " + json.dumps([{"kind": "video",
                                                        "sha256": sha256(client)}])
    after = counts(server)
    assert after["generation", "completed"] - before["generation", "completed"] == 1
    assert after["generation", "aborted"] - before["generation", "aborted"] == 0


def test_an_oversized_mp4_fails_the_request_before_the_next_turn(server: Server) -> None:
    body = {"prompt": script(video("!oversize big"), final("never shown")),
            "include_progress": True, "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    assert not any(reasoner_turn(e, d, 2) for e, d in events)
    assert segments_of(events) == []
    (error,) = [d for e, d in events if e == "error"]
    assert "over the 8 MiB inline limit" in error["message"], error


def test_a_client_gone_during_the_encode_aborts_it(server: Server) -> None:
    before = counts(server)
    body = {"prompt": script(video("!encode-delay=30 endless"), final("never")),
            "include_progress": True, "stream": True, "stage_params": {"generation": SMALL}}
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{server.url}/generate", json=body) as resp:
        assert resp.status_code == 200
        wait_for(lambda: "!encode-delay=30: the MP4 takes 30 s more" in server.log(),
                 timeout=25)  # the frames are made and the encode is running: go away
    wait_for(lambda: counts(server)["generation", "aborted"]
             - before["generation", "aborted"] == 1)
    after = counts(server)
    assert after["generation", "completed"] - before["generation", "completed"] == 0


def test_a_turn_that_fails_after_the_video_still_gets_the_video_first(server: Server) -> None:
    refusal = {"error": {"status": 400, "message": "the Reasoner refused this turn"}}
    body = {"prompt": script(video("!encode-delay=1 refused next"), refusal),
            "include_progress": True, "stage_params": {"generation": SMALL}}
    status, events = stream_generate(server, body)
    assert status == 200, events
    assert [e for e, _ in events if e != "progress"] == ["segment", "error", "message"]
    (segment,) = segments_of(events)
    assert segment["kind"] == "video" and segment["segment_index"] == 0
    assert "the Reasoner refused this turn" in only(events, "error")["message"]
