"""GPU out-of-memory inside an engine (issue 26): on every pipeline, a generation or a Reasoner
turn whose engine raises the allocation error of a full GPU (the scripted ``!oom`` directive and
``"oom": true`` script entry) fails that request at once with 500 ``server_error`` naming the
stage and what to change, a stream with its error event and ``[DONE]``; the other stage's work
for the request is cancelled; ``/health`` stays ok, the stage is not restarted (the same
process, ``sgl_omni_stage_restarts_total`` unchanged) and the next request on it is served."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.media.encode import encode_png
from tests.generation.kit import wait_video
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.supervision.kit import health, restarts
from tests.umm.kit import (
    SMALL,
    counts,
    final,
    image,
    only,
    post_chat,
    post_generate,
    script,
    segments_of,
    stream_generate,
    video,
    wait_for,
)

HTTP = httpx.Client(timeout=60)
GEN = {"stage_params": {"generation": SMALL}}


def assert_oom_answer(error: dict, stage: str, *hints: str) -> None:
    """The documented answer: 500 server_error naming the stage, and what to change."""
    assert error["code"] == 500 and error["type"] == "server_error", error
    message = error["message"]
    assert f"the {stage} stage ran out of GPU memory for this request" in message, message
    assert "CUDA out of memory" in message, message
    for hint in (*hints, f"stages.{stage}.gpu_memory_fraction",
                 "serves other requests"):
        assert hint in message, message


class StageWatch:
    """A stage's process and restart count before a fault, to check after it."""

    def __init__(self, server: Server, stage: str) -> None:
        self.server, self.stage = server, stage
        self.pid = server.stage_pid(stage)
        self.restarts = restarts(server, stage)

    def assert_unharmed(self) -> None:
        body = health(self.server).json()
        assert body["status"] == "ok", body
        assert body["stages"][self.stage]["last_fault"] is None, body
        assert body["stages"][self.stage]["gpu_memory"] is None, body  # a CPU stage
        assert self.server.stage_pid(self.stage) == self.pid, "the stage was restarted"
        assert restarts(self.server, self.stage) == self.restarts


@pytest.fixture(scope="module")
def umm() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM) as server:
        yield server


def test_interleaved_generation_oom_fails_the_request_and_the_next_is_served(umm: Server
                                                                             ) -> None:
    watch = StageWatch(umm, "generation")
    before = counts(umm)
    resp = post_generate(umm, {"prompt": script(image("!oom a cat"), final("never")), **GEN})
    assert resp.status_code == 500, resp.text
    assert_oom_answer(resp.json()["error"], "generation", "smaller width and height",
                      "fewer num_frames")
    after = counts(umm)
    # The Reasoner ran its one turn; nothing more was asked of it after the failure.
    assert after["reasoner", "submitted"] - before["reasoner", "submitted"] == 1
    assert after["generation", "failed"] - before["generation", "failed"] == 1
    watch.assert_unharmed()
    ok = post_generate(umm, {"prompt": script(image("a cat"), final("done")), **GEN})
    assert ok.status_code == 200, ok.text


def test_a_streamed_oom_ends_with_the_error_event_and_done(umm: Server) -> None:
    watch = StageWatch(umm, "generation")
    status, events = stream_generate(
        umm, {"prompt": script(image("first"), image("!oom second"), final("never")), **GEN})
    assert status == 200, events
    names = [e for e, _ in events if e != "progress"]
    assert names == ["segment", "error", "message"], names  # the first image, then the error
    assert len(segments_of(events)) == 1
    assert_oom_answer(only(events, "error"), "generation", "fewer num_frames")
    assert events[-1] == ("message", "[DONE]"), events[-1]
    watch.assert_unharmed()
    status, events = stream_generate(umm, {"prompt": script(image("again"), final("ok")), **GEN})
    assert status == 200 and "error" not in [e for e, _ in events], events


def test_a_reasoner_oom_after_a_video_fails_at_once(umm: Server) -> None:
    """The Reasoner's turn after a video fails on a full GPU: the video went out first (the
    turn reads the finished MP4), then the error, at once."""
    reasoner, generation = StageWatch(umm, "reasoner"), StageWatch(umm, "generation")
    before = counts(umm)
    body = {"prompt": script(video("a slow clip"), {"oom": True}), **GEN}
    status, events = stream_generate(umm, body)
    # at once: the failed turn is the request's last (no retry, no wait for another turn)
    wait_for(lambda: counts(umm)["reasoner", "failed"] - before["reasoner", "failed"] == 1)
    assert counts(umm)["reasoner", "submitted"] - before["reasoner", "submitted"] == 2
    assert status == 200, events
    assert [e for e, _ in events if e != "progress"] == ["segment", "error", "message"], events
    assert_oom_answer(only(events, "error"), "reasoner", "fewer or smaller images and videos",
                      "max_tokens")
    wait_for(lambda: counts(umm)["generation", "completed"]
             - before["generation", "completed"] == 1)
    reasoner.assert_unharmed()
    generation.assert_unharmed()
    ok = post_generate(umm, {"prompt": script(video("a clip"), final("done")), **GEN})
    assert ok.status_code == 200, ok.text


def test_a_reasoner_oom_on_interleaved_chat_completions(umm: Server) -> None:
    watch = StageWatch(umm, "reasoner")
    resp = post_chat(umm, {"messages": [{"role": "user", "content": script({"oom": True})}],
                           **GEN})
    assert resp.status_code == 500, resp.text
    assert_oom_answer(resp.json()["error"], "reasoner", "shorter conversation")
    watch.assert_unharmed()
    ok = post_chat(umm, {"messages": [{"role": "user", "content": script(final("fine"))}],
                         **GEN})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("stream", [False, True])
def test_text_chat_reasoner_oom(stream: bool) -> None:
    with Server(*SCRIPTED_CHAT) as chat:
        watch = StageWatch(chat, "reasoner")
        body = {"messages": [{"role": "user", "content": script({"oom": True})}],
                "stream": stream}
        resp = HTTP.post(f"{chat.url}/v1/chat/completions", json=body)
        if stream:
            assert resp.status_code == 200, resp.text
            lines = [line for line in resp.text.splitlines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]", lines
            error = next(line for line in lines if '"error"' in line)
            assert_oom_answer(httpx.Response(200, content=error[6:]).json()["error"],
                              "reasoner", "max_tokens")
        else:
            assert resp.status_code == 500, resp.text
            assert_oom_answer(resp.json()["error"], "reasoner", "max_tokens")
        watch.assert_unharmed()
        ok = HTTP.post(f"{chat.url}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hello"}]})
        assert ok.status_code == 200, ok.text


def test_direct_routes_oom_image_video_and_action() -> None:
    with Server(*SCRIPTED_GENERATION) as direct:
        watch = StageWatch(direct, "generation")
        size = {"size": "32x32"}
        resp = HTTP.post(f"{direct.url}/v1/images/generations",
                         json={"prompt": "!oom a cat", **size})
        assert resp.status_code == 500, resp.text
        assert_oom_answer(resp.json()["error"], "generation", "smaller width and height")
        watch.assert_unharmed()
        ok = HTTP.post(f"{direct.url}/v1/images/generations", json={"prompt": "a cat", **size})
        assert ok.status_code == 200, ok.text

        job = HTTP.post(f"{direct.url}/v1/videos",
                        json={"prompt": "!oom a clip", "num_frames": 2, **size}).json()
        done = wait_video(direct, job["id"])
        assert done["status"] == "failed", done
        assert_oom_answer(done["error"], "generation", "fewer num_frames")
        watch.assert_unharmed()
        job = HTTP.post(f"{direct.url}/v1/videos",
                        json={"prompt": "a clip", "num_frames": 2, **size}).json()
        assert wait_video(direct, job["id"])["status"] == "completed"

        observation = base64.b64encode(encode_png(frame_pixels("obs", 0, 8, 8, 0))).decode()
        params = {"domain_name": "droid_lerobot", "raw_action_dim": 8}

        def act(task: str) -> httpx.Response:
            return HTTP.post(f"{direct.url}/v1/actions/generations", json={
                "input": {"task": task, "image": {"b64_json": observation}},
                "parameters": params})

        resp = act("!oom pick up the cup")
        assert resp.status_code == 500, resp.text
        assert_oom_answer(resp.json()["error"], "generation")
        watch.assert_unharmed()
        assert act("pick up the cup").status_code == 200
