"""Every media reference of a request is found and checked, with a label naming where it sits."""

from __future__ import annotations

import base64

import pytest

from sglang_omni.errors import BadRequest, MediaRefused
from sglang_omni.media import (
    MediaPolicy,
    check_chat_request,
    check_generation_media,
    check_media_refs,
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
    with pytest.raises(MediaRefused, match="image_path: local paths are refused"):
        check_generation_media(opts, MediaPolicy())  # no local files without the flag
    check_generation_media({**opts, "image_path": "http://a/0.png"}, MediaPolicy())
    with pytest.raises(MediaRefused, match=r"video_path\[0\]"):
        check_generation_media({"video_path": ["gopher://x/"]}, MediaPolicy())
    with pytest.raises(BadRequest, match="image_path"):
        check_generation_media({"image_path": 3}, MediaPolicy())


# --- request-wide limits -------------------------------------------------------------------------
def image_parts(n: int, url: str = "http://a/x.png") -> dict:
    return {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}} for _ in range(n)]}]}


def test_media_parts_over_the_limit_refused() -> None:
    policy = MediaPolicy(max_media_parts=3)
    check_chat_request(image_parts(3), policy)
    with pytest.raises(MediaRefused) as info:
        check_chat_request(image_parts(4), policy)
    message = info.value.message
    assert info.value.status == 400
    assert "messages[0].content[3].image_url.url" in message  # the first part over the limit
    assert "4 media references" in message and "--server.max_media_parts 3" in message
    # top-level lists and generation paths count too, all together
    body = {**image_parts(2), "images": ["http://a/y.png"],
            "stage_params": {"generation": {"image_path": "http://a/z.png"}}}
    with pytest.raises(MediaRefused, match="stage_params.generation.image_path: .*4 media"):
        check_chat_request(body, policy)
    with pytest.raises(MediaRefused, match="--server.max_media_parts 0"):
        check_chat_request(image_parts(1), MediaPolicy(max_media_parts=0))
    with pytest.raises(MediaRefused, match=r"video_path\[1\].*max_media_parts"):
        check_generation_media({"video_path": ["http://a/1.mp4"] * 2},
                                 MediaPolicy(max_media_parts=1))
    refs = [(f"input.images.{i}", "http://a/x.png") for i in range(5)]
    with pytest.raises(MediaRefused, match="input.images.4: .*max_media_parts"):
        check_media_refs(refs, MediaPolicy(max_media_parts=4))


def test_media_parts_counted_before_any_reference_is_resolved() -> None:
    # the 5th part is refused for the count even though the 1st would be refused for itself
    with pytest.raises(MediaRefused, match="max_media_parts"):
        check_chat_request(image_parts(5, "file:///etc/passwd"), MediaPolicy(max_media_parts=4))


def test_inline_media_bytes_added_over_the_request() -> None:
    one = "data:image/png;base64," + base64.b64encode(b"x" * 600).decode()
    policy = MediaPolicy(max_media_bytes=1000)
    check_chat_request(image_parts(1, one), policy)
    with pytest.raises(MediaRefused) as info:
        check_chat_request(image_parts(2, one), policy)
    assert info.value.status == 400
    assert "messages[0].content[1].image_url.url" in info.value.message
    assert "--server.max_media_bytes 1000" in info.value.message


def test_b64_json_images_count_like_inline_references() -> None:
    """The action route's ``{"b64_json": ...}`` images (sent beside the references, not as
    one) are held to the per-file limit and added into the request's max_media_bytes."""
    one = base64.b64encode(b"x" * 600).decode()
    policy = MediaPolicy(max_media_bytes=1000)
    check_media_refs([], policy, inline_images=[("input.image.b64_json", one)])
    with pytest.raises(MediaRefused) as info:  # a data: URL reference plus a b64_json image
        check_media_refs([("input.video", "data:image/png;base64," + one)], policy,
                         inline_images=[("input.image.b64_json", "data:image/png;base64," + one)])
    assert info.value.status == 400
    assert "input.image.b64_json" in info.value.message
    assert "--server.max_media_bytes 1000" in info.value.message
    with pytest.raises(MediaRefused) as info:
        check_media_refs([], MediaPolicy(max_file_size_mb=0.0005),
                         inline_images=[("input.image.b64_json", one)])
    assert "input.image.b64_json: inline media is larger than the 0.0005 MB limit " \
        "(media_url_max_file_size_mb)" in info.value.message


def test_b64_json_images_count_in_max_media_parts() -> None:
    """Each ``{"b64_json": ...}`` image is one of the request's media items, beside its
    references (they were counted in the bytes but not in the count)."""
    one = base64.b64encode(b"x" * 10).decode()
    policy = MediaPolicy(max_media_parts=2)
    refs = [("input.video", "http://a/v.mp4")]
    check_media_refs(refs, policy, inline_images=[("input.image.b64_json", one)])
    with pytest.raises(MediaRefused) as info:
        check_media_refs(refs, policy, inline_images=[("input.images.a.b64_json", one),
                                                      ("input.images.b.b64_json", one)])
    message = info.value.message
    assert info.value.status == 400
    assert message.startswith("input.images.b.b64_json: the request carries 3 media "), message
    assert "--server.max_media_parts 2" in message
    with pytest.raises(MediaRefused, match="max_media_parts 2"):
        check_media_refs([], policy, inline_images=[(f"input.images.{i}.b64_json", one)
                                                    for i in range(3)])
