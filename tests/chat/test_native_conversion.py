"""The native backend's request conversion and answer reading, without sglang installed
(``tests/native`` runs the same paths against the real sglang classes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sglang_omni.engines.native.lifecycle import exited, first_exit
from sglang_omni.engines.native.reasoner_request import (
    StreamReader,
    chat_request_fields,
    completion_result,
    localize_media,
    new_native_rid,
    refusal_from_error_body,
)
from sglang_omni.errors import BadRequest, MediaFetchFailed, MediaRefused, NativeRefusal
from sglang_omni.media import MediaPolicy, RequestMediaDir
from tests.chat.kit import data_url, media_host, png

KNOWN = {"temperature", "top_k", "max_tokens", "ignore_eos", "logprobs", "top_logprobs",
         "chat_template_kwargs", "response_format", "messages", "stream", "rid",
         "stream_options"}
PNG_BYTES = png((1, 2, 3))


def user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def localize(messages: list[dict], policy: MediaPolicy, frames: list[bytes] | None = None,
             base: Path | None = None) -> tuple[list[dict], RequestMediaDir]:
    workdir = RequestMediaDir(base)
    return asyncio.run(localize_media(messages, frames or [], policy, workdir)), workdir


def url_of(messages: list[dict], part: int = 1) -> str:
    content = messages[0]["content"][part]
    return content[content["type"]]["url"]


# --- request fields ---------------------------------------------------------------------------
def test_fields_merge_sampling_stage_params_and_what_omni_owns() -> None:
    payload = {"sampling": {"temperature": 0.2, "max_tokens": 9},
               "stage_params": {"temperature": 0.5, "ignore_eos": True},
               "options": {"logprobs": True, "other": 1},
               "response_format": {"type": "json_object"}, "stream": False}
    fields = chat_request_fields(payload, user(), "omni-x", KNOWN)
    assert fields == {"temperature": 0.5, "max_tokens": 9, "ignore_eos": True,
                      "logprobs": True, "response_format": {"type": "json_object"},
                      "messages": user(), "stream": False, "rid": "omni-x"}


def test_streaming_fields_ask_native_for_usage() -> None:
    fields = chat_request_fields({"stream": True}, user(), "omni-x", KNOWN)
    assert fields["stream"] is True and fields["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("name", ["messages", "rid", "stream", "stream_options"])
def test_stage_params_cannot_set_omni_owned_fields(name: str) -> None:
    with pytest.raises(BadRequest, match=f"stage_params.reasoner.{name}: set by Omni"):
        chat_request_fields({"stage_params": {name: 1}}, user(), "omni-x", KNOWN)


def test_unknown_native_field_refused() -> None:
    with pytest.raises(BadRequest, match="stage_params.reasoner.tempature: not a native"):
        chat_request_fields({"stage_params": {"tempature": 1}}, user(), "omni-x", KNOWN)


def test_native_rids_are_fresh_and_equally_long() -> None:
    rids = {new_native_rid() for _ in range(100)}
    assert len(rids) == 100 and len({len(r) for r in rids}) == 1


# --- media ------------------------------------------------------------------------------------
def test_without_policy_flags_no_local_file_and_no_loopback_reaches_native(
        tmp_path: Path) -> None:
    """Secure by default: native SGLang never gets a path or URL to read by itself."""
    (tmp_path / "cube.png").write_bytes(PNG_BYTES)
    with media_host() as host:
        for ref in ("relative/b.png", str(tmp_path / "cube.png"), f"{host.url}/cube.png"):
            with pytest.raises(MediaRefused, match=r"messages\[0\]\.content\[1\]"):
                localize(user(image(ref)), MediaPolicy(), base=tmp_path)
        assert host.paths == []
    messages = user(image(data_url("image/png", PNG_BYTES)))
    out, workdir = localize(messages, MediaPolicy(), base=tmp_path)
    assert Path(urlsplit(url_of(out)).path).read_bytes() == PNG_BYTES  # a request file
    assert out[0]["content"][1]["image_url"]["detail"] == "low"  # other native keys kept
    workdir.close()


def test_local_file_inside_the_root_becomes_a_file_url(tmp_path: Path) -> None:
    (tmp_path / "cube.png").write_bytes(PNG_BYTES)
    out, workdir = localize(user(image(str(tmp_path / "cube.png"))),
                            MediaPolicy(allowed_local_media_path=tmp_path))
    assert url_of(out) == (tmp_path / "cube.png").resolve().as_uri()
    workdir.close()


def test_refused_reference_is_400_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(MediaRefused, match=r"messages\[0\]\.content\[1\]\.image_url"):
        localize(user(image("file:///etc/passwd")), MediaPolicy(), base=tmp_path)
    with pytest.raises(MediaRefused, match="not in --allowed-media-domain"):
        localize(user(image("https://evil.example/x.png")),
                 MediaPolicy(allowed_media_domains=("good.example",)), base=tmp_path)


def test_inline_and_frame_media_become_request_files_removed_with_the_request(
        tmp_path: Path) -> None:
    messages = user(image(data_url("image/png", PNG_BYTES)),
                    {"type": "video_url", "video_url": {"url": "omni-frame://0"}})
    clip = b"\x00\x00\x00\x18ftypisom" + b"\x00" * 32
    out, workdir = localize(messages, MediaPolicy(allowed_local_media_path=tmp_path), [clip],
                            base=tmp_path)
    files = [Path(urlsplit(url_of(out, i)).path) for i in (1, 2)]
    assert files[0].read_bytes() == PNG_BYTES and files[1].read_bytes() == clip
    assert files[1].suffix == ".mp4" and all(workdir.contains(f) for f in files)
    workdir.close()
    assert not any(f.exists() for f in files)


def test_frame_index_out_of_range_refused() -> None:
    with pytest.raises(BadRequest, match="omni-frame://3 names no inline media"):
        localize(user(image("omni-frame://3")), MediaPolicy(), [b"x"])


def test_allowlisted_host_is_fetched_by_omni(tmp_path: Path) -> None:
    with media_host() as host:
        policy = MediaPolicy(allowed_media_domains=("127.0.0.1",))
        out, workdir = localize(user(image(f"{host.url}/cube.png")), policy, base=tmp_path)
        assert host.paths == ["/cube.png"]
        assert Path(urlsplit(url_of(out)).path).read_bytes() == png((10, 200, 10))
        workdir.close()


def test_failed_fetch_keeps_the_chat_route_status(tmp_path: Path) -> None:
    policy = MediaPolicy(allowed_media_domains=("127.0.0.1",), fetch_timeout_s=0.5,
                         fetch_deadline_s=2)
    with pytest.raises(MediaFetchFailed) as failed:
        localize(user(image("http://127.0.0.1:9/none.png")), policy, base=tmp_path)
    assert failed.value.status == 500


# --- answers ----------------------------------------------------------------------------------
def test_completion_body_to_result() -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "hello"},
                         "finish_reason": "length", "logprobs": {"content": []}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                      "reasoning_tokens": 0}}
    assert completion_result(body) == {
        "text": "hello", "finish_reason": "length", "logprobs": {"content": []},
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


@pytest.mark.parametrize("status,kind", [(400, "invalid_request_error"),
                                         (404, "not_found_error"),
                                         (503, "service_unavailable"),
                                         (500, "server_error"), (429, "invalid_request_error")])
def test_native_error_keeps_its_status(status: int, kind: str) -> None:
    error = refusal_from_error_body(status, {"object": "error", "message": "why",
                                             "type": "X", "code": status})
    assert (error.status, error.type, error.message) == (status, kind, "native SGLang: why")


def sse(obj: object) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def chunk(delta: dict, finish: str | None = None) -> str:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_stream_reader_forwards_deltas_and_keeps_usage() -> None:
    emitted: list[dict] = []
    reader = StreamReader(emitted.append)
    for item in [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                 chunk({"content": "lo"}), chunk({}, "stop"),
                 sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                               "total_tokens": 5}}),
                 "data: [DONE]\n\n"]:
        reader.feed(item)
    assert emitted == [{"text": ""}, {"text": "Hel"}, {"text": "lo"}]
    assert reader.result() == {"text": "Hello", "finish_reason": "stop", "usage": {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_stream_reader_maps_error_events() -> None:
    reader = StreamReader(lambda _: None)
    reader.feed(chunk({"role": "assistant", "content": ""}))
    with pytest.raises(NativeRefusal) as refused:
        reader.feed(sse({"error": {"message": "The request queue is full", "code": 503}}))
    assert refused.value.status == 503


def test_stream_without_done_is_a_server_error() -> None:
    reader = StreamReader(lambda _: None)
    reader.feed(chunk({"content": "partial"}))
    with pytest.raises(NativeRefusal, match="without \\[DONE\\]"):
        reader.result()


# --- lifecycle helpers ------------------------------------------------------------------------
def test_first_exit_names_the_process() -> None:
    codes = {"scheduler": None, "detokenizer": None}
    probes = {name: (lambda n=name: codes[n]) for name in codes}
    assert exited(probes) is None

    async def scenario() -> str:
        waiter = asyncio.ensure_future(first_exit(probes, poll_s=0.01))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        codes["detokenizer"] = -9
        return await asyncio.wait_for(waiter, 5)

    assert asyncio.run(scenario()) == "detokenizer exited with code -9"


def test_first_exit_wakes_on_a_failure_signal() -> None:
    async def scenario() -> str:
        wake = asyncio.Event()
        wake.set()
        return await first_exit({"p": lambda: None}, poll_s=0.01, wake=wake, settle_s=0.05)

    assert "signalled a failure" in asyncio.run(scenario())
