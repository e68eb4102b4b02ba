"""Interleaved /v1/chat/completions: segments beside the text, streamed segments, client chat
media fed to every turn, and the stock ``openai`` client reading both forms."""

from __future__ import annotations

import json

import openai
import pytest

from sglang_omni.engines.synth_media import encode_png, frame_pixels
from tests.server import Server
from tests.umm.kit import (
    HTTP,
    SMALL,
    final,
    image,
    media_bytes,
    parse_sse,
    png_data_url,
    post_chat,
    post_generate,
    script,
    sha256,
    video,
)


def user(text: str, *parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def stream_chat(server: Server, body: dict) -> list[dict]:
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        raw = resp.read().decode()
    events = parse_sse(raw)
    assert all(event == "message" for event, _ in events)
    assert events[-1][1] == "[DONE]"
    return [data for _, data in events[:-1]]


IMAGE_THEN_ANSWER = script(image("a cube"), final("a cube it is"))


# --- 11. segments on the chat route --------------------------------------------------------------
def test_completion_has_segments_beside_the_joined_text(server: Server) -> None:
    resp = post_chat(server, {"messages": user(IMAGE_THEN_ANSWER),
                              "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert [s["kind"] for s in message["segments"]] == ["image", "text"]
    assert message["content"] == "a cube it is" == message["segments"][1]["data"]
    assert [s["segment_index"] for s in message["segments"]] == [0, 1]
    data = media_bytes(message["segments"][0])
    assert message["segments"][0]["data"]["sha256"] == sha256(data)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["object"] == "chat.completion"


def test_completion_without_text_has_empty_content(server: Server) -> None:
    resp = post_chat(server, {"messages": user(script(video("clip"), final(" "))),
                              "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert message["content"] == ""
    assert [s["kind"] for s in message["segments"]] == ["video"]


def test_stream_sends_each_segment_as_delta_segment(server: Server) -> None:
    chunks = stream_chat(server, {"messages": user(IMAGE_THEN_ANSWER),
                                  "stage_params": {"generation": SMALL}})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    segments = [d["segment"] for d in deltas if "segment" in d]
    assert [s["kind"] for s in segments] == ["image", "text"]
    assert [s["segment_index"] for s in segments] == [0, 1]
    image_delta, text_delta = deltas[1], deltas[2]
    assert "content" not in image_delta
    assert text_delta["content"] == "a cube it is" == text_delta["segment"]["data"]
    assert media_bytes(image_delta["segment"])  # streamed media carry their data URL
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1


def test_streamed_and_plain_chat_segments_agree(server: Server) -> None:
    body = {"messages": user(script(image("same"), final("same answer"))),
            "stage_params": {"generation": SMALL}}
    plain = post_chat(server, body).json()["choices"][0]["message"]["segments"]
    streamed = [c["choices"][0]["delta"]["segment"] for c in stream_chat(server, body)
                if "segment" in c["choices"][0]["delta"]]

    def strip(segments: list[dict]) -> list[dict]:
        return [{k: v for k, v in s.items() if k != "execution_id"} for s in segments]

    assert strip(streamed) == strip(plain)


def test_stream_failure_sends_an_error_body(server: Server) -> None:
    chunks = stream_chat(server, {"messages": user(script(image("!no-media"))),
                                  "stage_params": {"generation": SMALL}})
    assert chunks[-1]["error"]["code"] == 500
    assert "without media" in chunks[-1]["error"]["message"]


def test_openai_client_reads_segments(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    resp = client.chat.completions.create(
        model="cosmos3", messages=user(IMAGE_THEN_ANSWER),
        extra_body={"stage_params": {"generation": SMALL}})
    message = resp.choices[0].message
    segments = message.model_extra["segments"]
    assert getattr(message, "segments") == segments  # noqa: B009 - an extra field
    assert [s["kind"] for s in segments] == ["image", "text"]
    assert message.content == "a cube it is"


def test_openai_client_reads_streamed_segments(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="cosmos3", messages=user(IMAGE_THEN_ANSWER), stream=True,
        extra_body={"stage_params": {"generation": SMALL}})
    segments, content = [], ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        segment = getattr(delta, "segment", None)
        if segment is not None:
            assert segment == delta.model_extra["segment"]
            segments.append(segment)
        content += delta.content or ""
    assert [s["kind"] for s in segments] == ["image", "text"]
    assert content == "a cube it is"


@pytest.mark.parametrize("field", [{"logprobs": True}, {"response_format": {"type": "text"}}])
def test_chat_fields_the_interleaved_pipeline_sets_itself_are_refused(server: Server,
                                                                     field: dict) -> None:
    resp = post_chat(server, {"messages": user(script(final("x"))), **field})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == 400


# --- 2. client chat media come first -------------------------------------------------------------
CLIENT_PNG = encode_png(frame_pixels("the client's picture", 3, 16, 16, 0))


def test_client_chat_media_come_before_generated_media(server: Server) -> None:
    part = {"type": "image_url", "image_url": {"url": png_data_url(CLIENT_PNG)}}
    resp = post_chat(server, {
        "messages": user(script(image("{media}"), video("v"), final("{media}")), part),
        # at the Reasoner's own preset, it reads the client's MP4 (docs/interleaved.md)
        "stage_params": {"generation": {**SMALL, "x264_preset": "superfast"}}})
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    made_image, made_video, _ = message["segments"]
    client = {"kind": "image", "sha256": sha256(CLIENT_PNG)}
    assert json.loads(message["content"]) == [
        client,
        {"kind": "image", "sha256": made_image["data"]["sha256"]},
        {"kind": "video", "sha256": made_video["data"]["sha256"]},
    ]


def test_first_turn_sees_only_the_client_media(server: Server) -> None:
    part = {"type": "image_url", "image_url": {"url": png_data_url(CLIENT_PNG)}}
    resp = post_chat(server, {"messages": user(script(final("{media}")), part)})
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == [
        {"kind": "image", "sha256": sha256(CLIENT_PNG)}]


def test_generate_images_field_feeds_client_media_first(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(image("mine"), final("{media}")),
                                  "images": [png_data_url(CLIENT_PNG)],
                                  "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert json.loads(body["text"]) == [
        {"kind": "image", "sha256": sha256(CLIENT_PNG)},
        {"kind": "image", "sha256": body["segments"][0]["data"]["sha256"]}]
