"""Item 2 of the native chat stage: the request rules of ``--text-only`` chat, over HTTP with
the scripted Reasoner (the native backend's side of each rule is in ``tests/native``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
import pytest

from sglang_omni.media.encode import encode_mp4
from tests.chat.kit import (
    TEXT_ONLY,
    answer,
    chat,
    data_url,
    png,
    say,
    script,
    sse_events,
)
from tests.server import Server

RED, BLUE, GREEN = png((255, 0, 0)), png((0, 0, 255)), png((0, 255, 0))
CLIP = encode_mp4([np.full((16, 16, 3), 80, np.uint8)] * 2, 2)  # media are parsed at admission
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*TEXT_ONLY) as srv:
        yield srv


@pytest.mark.parametrize("stream", [False, True])
def test_text_only_serves_chat_completions(server: Server, stream: bool) -> None:
    """sgl-omni serve --model-path P --text-only serves /v1/chat/completions, both ways."""
    body = {"stream": stream, "messages": say("hello from the reasoner")}
    assert answer(server, body) == "hello from the reasoner"


@pytest.mark.parametrize("stream", [False, True])
def test_text_image_video_and_audio_parts(server: Server, stream: bool) -> None:
    content = [
        {"type": "text", "text": script({"action": "final", "text": "{media}"})},
        {"type": "image_url", "image_url": {"url": data_url("image/png", RED)}},
        {"type": "video_url", "video_url": {"url": data_url("video/mp4", CLIP)}},
        {"type": "audio_url", "audio_url": {"url": data_url("audio/wav", WAV)}},
    ]
    media = json.loads(answer(server, {"stream": stream,
                                       "messages": [{"role": "user", "content": content}]}))
    assert media == [{"kind": "image", "sha256": sha(RED)},
                     {"kind": "video", "sha256": sha(CLIP)}]


def test_unknown_part_type_refused(server: Server) -> None:
    content = [{"type": "input_file", "input_file": {"url": "x"}}]
    resp = chat(server, {"messages": [{"role": "user", "content": content}]})
    assert resp.status_code == 400 and "messages[0].content[0].type" in resp.text


@pytest.mark.parametrize("stream", [False, True])
def test_top_level_images_and_videos_join_the_last_user_message(server: Server,
                                                                stream: bool) -> None:
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": script({"action": "final", "text": "{media}"})},
            {"type": "image_url", "image_url": {"url": data_url("image/png", RED)}}]},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": [
            {"type": "text", "text": "and these"},
            {"type": "image_url", "image_url": {"url": data_url("image/png", BLUE)}}]},
        {"role": "assistant", "content": "a last assistant turn after the last user message"},
    ]
    body = {"stream": stream, "messages": messages,
            "images": [data_url("image/png", GREEN)], "videos": [{"url": data_url("video/mp4",
                                                                                   CLIP)}]}
    kinds = [(m["kind"], m["sha256"]) for m in json.loads(answer(server, body))]
    # order of the conversation: the first message's image, then the last user message's own
    # image followed by the top-level image and video added to it
    assert kinds == [("image", sha(RED)), ("image", sha(BLUE)), ("image", sha(GREEN)),
                     ("video", sha(CLIP))]


def test_top_level_media_without_a_user_message_refused(server: Server) -> None:
    resp = chat(server, {"messages": [{"role": "system", "content": "x"}],
                         "images": [data_url("image/png", RED)]})
    assert resp.status_code == 400 and "no user message" in resp.text


@pytest.mark.parametrize("field,value", [
    ("audios", [data_url("audio/wav", WAV)]),
    ("video_fps", 2),
    ("video_max_frames", 8),
    ("max_frames", 8),
    ("fps", 1.5),
])
@pytest.mark.parametrize("stream", [False, True])
def test_top_level_audios_and_video_options_refused(server: Server, field: str, value: object,
                                                    stream: bool) -> None:
    resp = chat(server, {"stream": stream, "messages": say("x"), field: value})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == 400 and error["message"].startswith(f"{field}:")
    assert "content part" in error["message"]


def test_video_options_under_stage_params_refused(server: Server) -> None:
    resp = chat(server, {"messages": say("x"),
                         "stage_params": {"reasoner": {"video_fps": 2}}})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("stage_params.reasoner.video_fps:")


@pytest.mark.parametrize("stream", [False, True])
def test_sampling_fields_left_out_are_not_sent(server: Server, stream: bool) -> None:
    """Only the fields the client set reach the stage; native SGLang fills the rest from the
    checkpoint's generation config (checked against the real classes in tests/native)."""
    assert json.loads(answer(server, {"stream": stream, "messages": say("{sampling}")})) == {}
    body = {"stream": stream, "messages": say("{sampling}"), "temperature": 0.2,
            "max_tokens": 16}
    assert json.loads(answer(server, body)) == {"max_tokens": 16, "temperature": 0.2}


def test_stage_sampling_outranks_top_level_sampling(server: Server) -> None:
    body = {"messages": say("{sampling}"), "temperature": 0.2, "top_p": 0.9,
            "stage_sampling": {"reasoner": {"top_p": 0.5, "top_k": 7}}}
    assert json.loads(answer(server, body)) == {"temperature": 0.2, "top_p": 0.5, "top_k": 7}


@pytest.mark.parametrize("stream", [False, True])
def test_stage_params_reach_the_stage(server: Server, stream: bool) -> None:
    params = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}
    body = {"stream": stream, "messages": say("{stage_params}"),
            "stage_params": {"reasoner": params}}
    assert json.loads(answer(server, body)) == params


@pytest.mark.parametrize("stream", [False, True])
def test_native_refusal_keeps_its_status(server: Server, stream: bool) -> None:
    """A field native SGLang finds invalid answers 400, streaming or not (the scripted
    Reasoner's error entry stands in for native validation)."""
    messages = [{"role": "user", "content": script(
        {"error": {"status": 400, "message": "stop_token_ids: Input should be a valid list"}})}]
    resp = chat(server, {"stream": stream, "messages": messages,
                         "stage_params": {"reasoner": {"stop_token_ids": "many"}}})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == {"message": "stop_token_ids: Input should be a valid list",
                                    "type": "invalid_request_error", "code": 400}


@pytest.mark.parametrize("name", ["messages", "stream", "stream_options", "rid"])
def test_stage_params_cannot_replace_what_omni_sets(server: Server, name: str) -> None:
    resp = chat(server, {"messages": say("x"), "stage_params": {"reasoner": {name: 1}}})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith(f"stage_params.reasoner.{name}:")


def test_stage_params_for_an_unknown_stage_refused(server: Server) -> None:
    resp = chat(server, {"messages": say("x"), "stage_params": {"generation": {"seed": 1}}})
    assert resp.status_code == 400 and "stage_params.generation" in resp.text


def test_unknown_top_level_field_points_to_stage_params(server: Server) -> None:
    resp = chat(server, {"messages": say("x"), "ignore_eos_please": True})
    assert resp.status_code == 400 and "stage_params.reasoner" in resp.text


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("where", ["top", "stage_params"])
@pytest.mark.parametrize("fields,stream,needle", [
    ({"tools": TOOLS}, False, "tools"),
    ({"tool_choice": "required"}, False, "tool_choice"),
    ({"n": 2}, False, "n"),
    ({"n": 3}, True, "n"),
    ({"logprobs": True}, True, "logprobs"),
    ({"top_logprobs": 2}, True, "logprobs"),
])
def test_tools_choices_and_streamed_logprobs_refused(server: Server, where: str, fields: dict,
                                                     stream: bool, needle: str) -> None:
    body: dict = {"stream": stream, "messages": say("x")}
    if where == "top":
        body.update(fields)
        prefix = ""
    else:
        body["stage_params"] = {"reasoner": fields}
        prefix = "stage_params.reasoner."
    resp = chat(server, body)
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith(f"{prefix}{needle}:") and "sglang serve" in message


def test_logprobs_without_stream_accepted(server: Server) -> None:
    resp = chat(server, {"messages": say("fine"), "logprobs": True, "top_logprobs": 2, "n": 1})
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "fine"


def test_stream_usage_and_error_shape(server: Server) -> None:
    resp = chat(server, {"stream": True, "messages": say("a b c"),
                         "stream_options": {"include_usage": True}})
    events = sse_events(resp.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == 3
    assert events[-1] == "[DONE]"
