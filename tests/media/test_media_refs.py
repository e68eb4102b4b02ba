"""Every media reference of a request is found and checked, with a label naming where it sits."""

from __future__ import annotations

import pytest

from sglang_omni.errors import BadRequest, MediaRefused
from sglang_omni.media import (
    MediaPolicy,
    check_chat_request,
    check_generation_options,
    iter_chat_media_refs,
    iter_generation_media_refs,
)

BODY = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "plain text"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "http://a/1.png"}},
                {"type": "video_url", "video_url": "http://a/2.mp4"},
                {"type": "audio_url", "audio_url": {"url": "http://a/3.wav", "detail": "x"}},
                {"type": "text", "image_url": {"url": "http://a/hidden.png"}},
            ],
        },
    ],
    "images": ["http://a/4.png", {"url": "http://a/5.png"}],
    "videos": [{"url": "http://a/6.mp4"}],
}


def test_all_chat_refs_found_with_labels() -> None:
    assert list(iter_chat_media_refs(BODY)) == [
        ("messages[1].content[1].image_url.url", "http://a/1.png"),
        ("messages[1].content[2].video_url", "http://a/2.mp4"),
        ("messages[1].content[3].audio_url.url", "http://a/3.wav"),
        # a part that lies about its type is still checked
        ("messages[1].content[4].image_url.url", "http://a/hidden.png"),
        ("images[0]", "http://a/4.png"),
        ("images[1].url", "http://a/5.png"),
        ("videos[0].url", "http://a/6.mp4"),
    ]


def test_chat_request_refused_naming_the_reference() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"image_url": {"url": "file:///etc/passwd"}}]}]
    }
    with pytest.raises(MediaRefused) as info:
        check_chat_request(body, MediaPolicy())
    assert info.value.status == 400
    assert "messages[0].content[0].image_url.url" in info.value.message
    assert "--allowed-local-media-path" in info.value.message
    check_chat_request(BODY, MediaPolicy())  # all http: passes without an allowlist
    with pytest.raises(MediaRefused, match=r"images\[0\].*not in --allowed-media-domain"):
        check_chat_request(
            {"images": ["http://evil/x.png"]}, MediaPolicy(allowed_media_domains=("a",))
        )


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"content": [{"type": "image_url", "image_url": {"url": ["x"]}}]}]},
        {"messages": [{"content": [{"type": "image_url", "image_url": None}]}]},
        {"messages": [{"content": [{"type": "video_url", "video_url": {"uri": "x"}}]}]},
        {"images": "http://a/x.png"},
        {"videos": [1]},
    ],
)
def test_malformed_media_fields_are_bad_requests(body: dict) -> None:
    with pytest.raises(BadRequest):
        list(iter_chat_media_refs(body))


def test_generation_options() -> None:
    opts = {"image_path": "/tmp/a.png", "video_path": ["http://a/1.mp4", "data:;base64,YWJj"]}
    assert list(iter_generation_media_refs(opts, prefix="extra_body.")) == [
        ("extra_body.image_path", "/tmp/a.png"),
        ("extra_body.video_path[0]", "http://a/1.mp4"),
        ("extra_body.video_path[1]", "data:;base64,YWJj"),
    ]
    check_generation_options(opts, MediaPolicy())
    with pytest.raises(MediaRefused, match=r"video_path\[0\]"):
        check_generation_options({"video_path": ["gopher://x/"]}, MediaPolicy())
    with pytest.raises(BadRequest, match="image_path"):
        check_generation_options({"image_path": 3}, MediaPolicy())
