"""Interleaved /generate over real HTTP with the scripted engines: segments, media fed back to the
Reasoner, text that survives every hop, blank answers and prompts, and decision sampling."""

from __future__ import annotations

import json

import pytest

from sglang_omni.config.server import ServerSettings
from sglang_omni.engines.synth_media import decode_mp4_frames, encode_mp4, frame_pixels
from sglang_omni.media.encode import VideoEncoding
from tests.server import Server
from tests.umm.kit import (
    HTTP,
    SMALL,
    STABLE,
    counts,
    final,
    image,
    media_bytes,
    only,
    png_size,
    post_generate,
    reference,
    script,
    segments_of,
    sha256,
    stream_generate,
    video,
    without_execution_id,
)

TWO_GENERATIONS = script(image("a red cube"), video("a blue cube turning"),
                         final("compared {media}"))


@pytest.fixture(scope="module")
def two_generations(server: Server) -> dict[str, object]:
    """The image-video-final request, once non-streaming and once streaming."""
    body = {"prompt": TWO_GENERATIONS, "stage_params": {"generation": dict(STABLE)}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    status, events = stream_generate(server, body)
    assert status == 200
    return {"json": resp.json(), "events": events}


# --- 1. segments ---------------------------------------------------------------------------------
def test_streamed_and_non_streamed_segments_are_identical(two_generations: dict) -> None:
    plain = two_generations["json"]["segments"]
    streamed = segments_of(two_generations["events"])
    assert [s["kind"] for s in plain] == ["image", "video", "text"]
    assert [without_execution_id(s) for s in streamed] == [without_execution_id(s) for s in plain]


def test_segments_are_numbered_from_zero_under_the_execution_id(two_generations: dict) -> None:
    body = two_generations["json"]
    for segments in (body["segments"], segments_of(two_generations["events"])):
        assert [s["segment_index"] for s in segments] == list(range(len(segments)))
        assert all(s["type"] == "segment" for s in segments)
        assert len({s["execution_id"] for s in segments}) == 1
    assert {s["execution_id"] for s in body["segments"]} == {body["execution_id"]}
    assert body["finish_reason"] == "stop"
    assert body["text"] == body["segments"][2]["data"]


def test_stream_ends_with_complete_references_then_done(two_generations: dict) -> None:
    events = two_generations["events"]
    assert [e for e, _ in events] == ["segment"] * 3 + ["complete", "message"]
    assert events[-1] == ("message", "[DONE]")
    complete = only(events, "complete")
    streamed = segments_of(events)
    assert complete["finish_reason"] == "stop"
    assert complete["execution_id"] == streamed[0]["execution_id"]
    assert complete["segments"] == [reference(s) for s in streamed]
    assert all("data" not in ref for ref in complete["segments"])  # references without data


def test_media_data_matches_its_data_url(two_generations: dict) -> None:
    for segment in two_generations["json"]["segments"][:2]:
        data = media_bytes(segment)
        assert segment["data"]["kind"] == segment["kind"]
        assert segment["data"]["size_bytes"] == len(data)
        assert segment["data"]["sha256"] == sha256(data)
    mimes = [s["data"]["mime_type"] for s in two_generations["json"]["segments"][:2]]
    assert mimes == ["image/png", "video/mp4"]


def test_png_has_the_requested_size(two_generations: dict) -> None:
    data = media_bytes(two_generations["json"]["segments"][0])
    assert png_size(data) == (STABLE["width"], STABLE["height"])


def test_video_has_33_frames_by_default(two_generations: dict) -> None:
    frames = decode_mp4_frames(media_bytes(two_generations["json"]["segments"][1]))
    assert len(frames) == 33
    assert frames[0].shape == (STABLE["height"], STABLE["width"], 3)


def test_num_frames_sets_the_video_length(server: Server) -> None:
    body = {"prompt": script(video("short clip"), final("ok")),
            "stage_params": {"generation": {"width": 32, "height": 32, "num_frames": 9}}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    assert len(decode_mp4_frames(media_bytes(resp.json()["segments"][0]))) == 9


# --- 2. media fed back ---------------------------------------------------------------------------
def test_final_turn_sees_the_generated_image_then_video(two_generations: dict) -> None:
    """The Reasoner reads the bytes the client gets: the PNG and the one MP4 (issue 34)."""
    segments = two_generations["json"]["segments"]
    seen = json.loads(segments[2]["data"].removeprefix("compared "))
    assert seen == [{"kind": "image", "sha256": segments[0]["data"]["sha256"]},
                    {"kind": "video", "sha256": segments[1]["data"]["sha256"]}]
    frames = [frame_pixels("a blue cube turning", 0, STABLE["width"], STABLE["height"], i)
              for i in range(33)]
    assert media_bytes(segments[1]) == encode_mp4(frames, 24, encoding=VideoEncoding())


@pytest.mark.parametrize("preset", ServerSettings().allowed_x264_presets)
def test_the_reasoner_reads_the_client_mp4_at_every_allowed_preset(server: Server,
                                                                    preset: str) -> None:
    """Whatever ``x264_preset`` the request names, the next turn's ``{media}`` lists the
    sha256 of the very image and video the client's segments carry."""
    body = {"prompt": script(image("a still"), video(f"a clip at {preset}"), final("{media}")),
            "stage_params": {"generation": {**SMALL, "x264_preset": preset}}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    still, clip, answer = resp.json()["segments"]
    assert [sha256(media_bytes(s)) for s in (still, clip)] == \
        [still["data"]["sha256"], clip["data"]["sha256"]]
    assert json.loads(answer["data"]) == [{"kind": "image", "sha256": still["data"]["sha256"]},
                                          {"kind": "video", "sha256": clip["data"]["sha256"]}]
    frames = [frame_pixels(f"a clip at {preset}", 0, SMALL["width"], SMALL["height"], i)
              for i in range(SMALL["num_frames"])]
    assert media_bytes(clip) == encode_mp4(frames, 24, encoding=VideoEncoding(preset))


def test_an_unknown_x264_preset_is_refused_before_any_turn(server: Server) -> None:
    body = {"prompt": script(video("clip"), final("ok")),
            "stage_params": {"generation": {"x264_preset": "ludicrous"}}}
    resp = post_generate(server, body)
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith("stage_params.generation.x264_preset: expected one of x264's "
                              "presets (ultrafast, superfast"), message


def test_every_turn_sees_all_media_generated_so_far(server: Server) -> None:
    body = {"prompt": script(image("one"), image("two {media}"), final("{media}")),
            "stage_params": {"generation": SMALL}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    first, second, answer = resp.json()["segments"]
    assert json.loads(answer["data"]) == [{"kind": "image", "sha256": first["data"]["sha256"]},
                                          {"kind": "image", "sha256": second["data"]["sha256"]}]


# --- 3. text survives ----------------------------------------------------------------------------
AWKWARD = 'He said "hi" \\o/ \'x\'\n\tline two\r\nC:\\path\\ {} ü ß 中文 🚀 \u00e9'


def test_awkward_prompt_reaches_the_generator_and_answer_survives(server: Server) -> None:
    body = {"prompt": script(image(AWKWARD), final(AWKWARD + " | {last}")),
            "stage_params": {"generation": SMALL}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    # {last} is the last message: the generation's note, then the turn's budget sentence
    expected = (f"{AWKWARD} | Generated image 1, from the prompt: {AWKWARD}\n\n"
                "You may create images and videos; 7 generation(s) left.")
    assert resp.json()["text"] == expected
    status, events = stream_generate(server, body)
    assert status == 200
    assert segments_of(events)[1]["data"] == expected


def test_line_separator_characters_survive_a_line_based_sse_reader(server: Server) -> None:
    # U+2028, U+2029, NEL and the other str.splitlines separators are not SSE line ends; httpx's
    # iter_lines (used by the SDK and many clients) still splits on them, so the server must not
    # send them raw inside a data line
    answer = "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"
    body = {"prompt": script(final(answer)), "stream": True}
    with HTTP.stream("POST", f"{server.url}/generate", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        data = [json.loads(line[5:]) for line in resp.iter_lines()
                if line.startswith("data:") and line != "data: [DONE]"]
    assert data[0]["data"] == answer


# --- 4. blank answers and prompts ----------------------------------------------------------------
def test_blank_final_answer_ends_without_a_text_segment(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(final("  \n\t "))})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["segments"], body["text"], body["finish_reason"]) == ([], "", "stop")


def test_blank_final_after_media_streams_only_the_media(server: Server) -> None:
    status, events = stream_generate(server, {"prompt": script(image("cube"), final("   ")),
                                              "stage_params": {"generation": SMALL}})
    assert status == 200
    assert [s["kind"] for s in segments_of(events)] == ["image"]
    complete = only(events, "complete")
    assert complete["finish_reason"] == "stop" and len(complete["segments"]) == 1


def test_blank_generation_prompt_is_not_run_and_comes_back_as_a_receipt(server: Server) -> None:
    before = counts(server)
    resp = post_generate(server, {"prompt": script(video("   "), final("{last}"))})
    assert resp.status_code == 200, resp.text
    after = counts(server)
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["text"]
    assert "blank" in body["text"] and "video" in body["text"]
    assert after["generation", "submitted"] == before["generation", "submitted"]
    assert after["reasoner", "submitted"] == before["reasoner", "submitted"] + 2


def test_generation_still_runs_after_a_blank_prompt(server: Server) -> None:
    before = counts(server)
    resp = post_generate(server, {"prompt": script(image(""), image("after the blank"),
                                                   final("{last}")),
                                  "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["image", "text"]
    assert body["text"] == ("Generated image 1, from the prompt: after the blank\n\n"
                            "You may create images and videos; 6 generation(s) left.")
    assert counts(server)["generation", "submitted"] == before["generation", "submitted"] + 1
    assert body["usage"]["generations"] == 1


# --- 9. sampling ---------------------------------------------------------------------------------
def test_decisions_are_greedy_without_client_sampling(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("{sampling}"), final("{sampling}")),
                                  "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["text"]) == {"temperature": 0.0}


def test_client_sampling_applies_to_every_decision(server: Server) -> None:
    body = {"prompt": script(image("{sampling}"), final("{sampling}|{last}")),
            "temperature": 0.7, "stage_sampling": {"reasoner": {"top_p": 0.9}},
            "stage_params": {"reasoner": {"top_k": 5}, "generation": SMALL}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    last, _, previous = resp.json()["text"].partition("|Generated image 1, from the prompt: ")
    previous, _, budget = previous.partition("\n\n")
    wanted = {"temperature": 0.7, "top_p": 0.9, "top_k": 5}
    assert json.loads(last) == wanted
    assert json.loads(previous) == wanted
    assert budget == "You may create images and videos; 7 generation(s) left."


def test_length_and_stop_settings_never_reach_a_decision(server: Server) -> None:
    body = {"prompt": script(image("{sampling}"), final("{sampling}")),
            "max_tokens": 7, "max_completion_tokens": 7, "stop": ["}"], "min_tokens": 1,
            "stage_sampling": {"reasoner": {"max_new_tokens": 3, "stop_token_ids": [1]}},
            "stage_params": {"reasoner": {"max_tokens": 3, "stop": "x"}, "generation": SMALL}}
    resp = post_generate(server, body)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["text"]) == {"temperature": 0.0}


def test_sampling_for_the_generation_stage_is_refused_naming_the_field(server: Server) -> None:
    """Only the Reasoner samples tokens: stage_sampling.generation was silently ignored."""
    before = counts(server)
    resp = post_generate(server, {"prompt": script(image("x"), final("no")),
                                  "stage_sampling": {"generation": {"seed": 3}},
                                  "stage_params": {"generation": SMALL}})
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith("stage_sampling.generation:")
    assert "stage_params.generation" in message
    assert counts(server) == before


# --- 10. rollout artifacts -----------------------------------------------------------------------
@pytest.mark.parametrize("extra", [{}, {"return_logprob": False},
                                   {"return_logprob": None, "return_hidden_states": False}])
def test_return_logprob_unset_or_false_is_accepted(server: Server, extra: dict) -> None:
    resp = post_generate(server, {"prompt": script(final("fine")), **extra})
    assert resp.status_code == 200, resp.text
    assert resp.json()["text"] == "fine"


@pytest.mark.parametrize("field", ["return_logprob", "return_hidden_states"])
@pytest.mark.parametrize("stream", [False, True])
def test_rollout_artifacts_are_refused(server: Server, field: str, stream: bool) -> None:
    before = counts(server)
    resp = post_generate(server, {"prompt": script(final("no")), field: True, "stream": stream})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert field in error["message"]
    assert counts(server)["reasoner", "submitted"] == before["reasoner", "submitted"]
