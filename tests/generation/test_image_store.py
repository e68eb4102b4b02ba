"""Images held for ``url`` answers: the video jobs' retention and count bounds, closed at
shutdown (unit)."""

from __future__ import annotations

import asyncio

import pytest

from sglang_omni.errors import NotFound, ServiceUnavailable
from sglang_omni.serve.direct import image_store
from sglang_omni.serve.direct.image_store import IMAGE_RETENTION_S, MAX_IMAGES, ImageStore
from sglang_omni.serve.direct.video_jobs import MAX_VIDEO_JOBS, VIDEO_RETENTION_S


def test_the_bounds_are_the_video_jobs() -> None:
    assert (MAX_IMAGES, IMAGE_RETENTION_S) == (MAX_VIDEO_JOBS, VIDEO_RETENTION_S)


def test_oldest_makes_room_and_variants() -> None:
    store = ImageStore()
    for i in range(MAX_IMAGES + 2):
        store.put(f"img{i}", b"png")
    assert len(store.images) == MAX_IMAGES
    with pytest.raises(NotFound, match="not found"):
        store.get("img0")
    assert store.get("img2").url == "/v1/images/img2/content"
    assert store.get("img2", "0").data == b"png"
    with pytest.raises(NotFound, match="variant 1"):
        store.get("img2", "1")


def test_images_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ImageStore()
    store.put("a", b"png")
    now = image_store.time.time()
    monkeypatch.setattr(image_store.time, "time", lambda: now + IMAGE_RETENTION_S + 1)
    with pytest.raises(NotFound):
        store.get("a")


def test_close_forgets_and_refuses() -> None:
    store = ImageStore()
    store.put("a", b"png")
    asyncio.run(store.close())
    assert not store.images
    with pytest.raises(ServiceUnavailable):
        store.put("b", b"png")
