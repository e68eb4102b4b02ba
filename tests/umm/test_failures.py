"""Interleaved requests that are refused (400 before any turn) or fail (500): generation faults,
generation options, modality rules, malformed or oversized Reasoner output, request ids."""

from __future__ import annotations

import httpx
import pytest

from tests.server import Server
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
)


def assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == status
    assert error["type"] == ("invalid_request_error" if status == 400 else "server_error")
    return error


# --- 5. generation faults ------------------------------------------------------------------------
def test_generation_without_media_fails_with_500(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("!no-media a cube"), final("never")),
                                  "stage_params": {"generation": SMALL}})
    error = assert_error(resp, 500)
    assert "without media" in error["message"]


def test_generation_without_media_fails_a_stream_with_an_error_event(server: Server) -> None:
    status, events = stream_generate(server, {
        "prompt": script(video("!no-media a clip"), final("never")),
        "stage_params": {"generation": SMALL}})
    assert status == 200
    assert segments_of(events) == []
    error = only(events, "error")
    assert error["code"] == 500 and error["type"] == "server_error"
    assert "without media" in error["message"]
    assert [e for e, _ in events] == ["error", "message"] and events[-1][1] == "[DONE]"


def test_generation_stage_log_gives_the_no_media_reason(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("!no-media logged"), final("never")),
                                  "rid": "no-media-logged", "stage_params": {"generation": SMALL}})
    assert resp.status_code == 500
    lines = [line for line in server.log().splitlines()
             if "[generation stage]" in line and "no-media-logged" in line]
    assert any("!no-media" in line for line in lines), server.log()[-3000:]


@pytest.mark.parametrize("directive, words", [
    ("!oversize", "over the 8 MiB inline limit"),
    ("!extra", "2 media items"),
    ("!malformed", "malformed"),
])
@pytest.mark.parametrize("kind", ["image", "video"])
def test_bad_generated_media_fails_with_500(server: Server, directive: str, words: str,
                                            kind: str) -> None:
    decision = image(f"{directive} x") if kind == "image" else video(f"{directive} x")
    resp = post_generate(server, {"prompt": script(decision, final("never")),
                                  "stage_params": {"generation": SMALL}})
    error = assert_error(resp, 500)
    assert words in error["message"]


def test_media_before_a_failed_generation_is_streamed_then_the_error(server: Server) -> None:
    status, events = stream_generate(server, {
        "prompt": script(image("fine"), image("!malformed"), final("never")),
        "stage_params": {"generation": SMALL}})
    assert status == 200
    assert [e for e, _ in events] == ["segment", "error", "message"]
    assert only(events, "error")["code"] == 500


# --- 6. generation options -----------------------------------------------------------------------
@pytest.mark.parametrize("options, words", [
    ({"output_path": "/tmp/out"}, "output_path"),
    ({"output_file_name": "x.png"}, "output_file_name"),
    ({"no_such_option": 1}, "no_such_option"),
    ({"width": "64"}, "width"),
    ({"num_frames": 2.5}, "num_frames"),
    ({"use_guardrails": "yes"}, "use_guardrails"),
    ({"seed": True}, "seed"),
    ({"width": 0}, "width"),
    ({"action_mode": "policy"}, "action_mode"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_generation_options_are_refused_before_any_turn(server: Server, options: dict,
                                                            words: str, stream: bool) -> None:
    before = counts(server)
    resp = post_generate(server, {"prompt": script(image("x"), final("never")), "stream": stream,
                                  "stage_params": {"generation": options}})
    error = assert_error(resp, 400)
    assert f"stage_params.generation.{words}" in error["message"]
    after = counts(server)
    assert after["reasoner", "submitted"] == before["reasoner", "submitted"]
    assert after["generation", "submitted"] == before["generation", "submitted"]


FORWARD = {"action_mode": "forward_dynamics", **SMALL}


def test_forward_dynamics_does_not_run_an_image(server: Server) -> None:
    before = counts(server)
    resp = post_generate(server, {"prompt": script(image("a still"), final("{last}")),
                                  "stage_params": {"generation": FORWARD}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["text"]
    assert "only videos may be generated" in body["text"]
    assert counts(server)["generation", "submitted"] == before["generation", "submitted"]


def test_forward_dynamics_runs_a_video_after_the_receipt(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("a still"), video("{last}"),
                                                   final("{last}")),
                                  "stage_params": {"generation": FORWARD}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["video", "text"]
    assert body["text"].startswith("Generated video 1, from the prompt: Receipt: only videos")


# --- 7. Reasoner output --------------------------------------------------------------------------
@pytest.mark.parametrize("raw", ["not json at all", "[1, 2]", '{"decision": "dance"}',
                                 '{"decision": "final_answer", "answer": 3}',
                                 '{"decision": "generate_image", "prompt": "x", "more": 1}'])
def test_malformed_reasoner_output_fails_with_500(server: Server, raw: str) -> None:
    error = assert_error(post_generate(server, {"prompt": script(raw)}), 500)
    assert "Reasoner" in error["message"]


def test_answer_over_8192_characters_fails_with_500(server: Server) -> None:
    assert post_generate(server, {"prompt": script(final("x" * 8192))}).status_code == 200
    error = assert_error(post_generate(server, {"prompt": script(final("x" * 8193))}), 500)
    assert "8192" in error["message"]


def test_prompt_over_4096_characters_fails_with_500(server: Server) -> None:
    before = counts(server)
    error = assert_error(post_generate(server, {"prompt": script(video("y" * 4097))}), 500)
    assert "4096" in error["message"]
    assert counts(server)["generation", "submitted"] == before["generation", "submitted"]


def test_prompt_of_4096_characters_runs(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("y" * 4096), final("ok")),
                                  "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    assert [s["kind"] for s in resp.json()["segments"]] == ["image", "text"]


# --- 13. request ids -----------------------------------------------------------------------------
def test_reused_request_id_is_refused(server: Server) -> None:
    body = {"prompt": script(final("once")), "rid": "umm-reused-rid"}
    assert post_generate(server, body).status_code == 200
    before = counts(server)
    error = assert_error(post_generate(server, body), 400)
    assert "fresh request ID" in error["message"]
    assert counts(server)["reasoner", "submitted"] == before["reasoner", "submitted"]


def test_request_id_reused_across_routes_is_refused(server: Server) -> None:
    assert post_generate(server, {"prompt": script(final("once")),
                                  "rid": "umm-cross-route"}).status_code == 200
    resp = post_chat(server, {"rid": "umm-cross-route",
                              "messages": [{"role": "user", "content": script(final("x"))}]})
    assert "fresh request ID" in assert_error(resp, 400)["message"]


def test_request_id_of_a_failed_request_is_not_reusable(server: Server) -> None:
    body = {"prompt": script("garbage"), "rid": "umm-failed-rid"}
    assert post_generate(server, body).status_code == 500
    assert_error(post_generate(server, {**body, "prompt": script(final("x"))}), 400)
