"""Images answered as ``url``: held in memory for ``GET /v1/images/{id}/content``.

The same bounds as video jobs (:mod:`.video_jobs`): an image is held until
:data:`IMAGE_RETENTION_S` passes, and at most :data:`MAX_IMAGES` are held (the oldest makes room
for a new one). :meth:`ImageStore.close` (server shutdown) forgets them all and refuses new ones.
Native SGLang serves this route from files under its output path (or refuses ``url`` without one);
Omni keeps no files.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from sglang_omni.errors import NotFound, ShuttingDown
from sglang_omni.serve.direct.video_jobs import MAX_VIDEO_JOBS, VIDEO_RETENTION_S

MAX_IMAGES = MAX_VIDEO_JOBS
IMAGE_RETENTION_S = VIDEO_RETENTION_S


@dataclass(frozen=True)
class StoredImage:
    id: str
    data: bytes = field(repr=False)
    media_type: str = "image/png"
    expires_at: float = 0.0

    @property
    def url(self) -> str:
        """The route that serves it, relative to the server."""
        return f"/v1/images/{self.id}/content"


class ImageStore:
    """The images held, oldest first."""

    def __init__(self) -> None:
        self.images: OrderedDict[str, StoredImage] = OrderedDict()
        self._closed = False

    def expire(self, now: float | None = None) -> None:
        """Forget images older than their retention."""
        now = time.time() if now is None else now
        for image in [i for i in self.images.values() if i.expires_at <= now]:
            del self.images[image.id]

    def put(self, image_id: str, data: bytes, media_type: str = "image/png") -> StoredImage:
        """Hold an image (503 once the server is shutting down)."""
        if self._closed:
            raise ShuttingDown()
        self.expire()
        while len(self.images) >= MAX_IMAGES:
            self.images.popitem(last=False)
        image = StoredImage(image_id, data, media_type, time.time() + IMAGE_RETENTION_S)
        self.images[image_id] = image
        return image

    def get(self, image_id: str, variant: str | None = None) -> StoredImage:
        """The image ``image_id`` (``variant`` 0 or none: each request makes one image)."""
        self.expire()
        image = self.images.get(image_id)
        if image is None:
            raise NotFound(f"image {image_id!r} not found (expired after {IMAGE_RETENTION_S} s, "
                           "answered as b64_json, or never created); ask for response_format "
                           "url to fetch an image here")
        if variant not in (None, "0"):
            raise NotFound(f"image variant {variant} not found: each request makes one image "
                           "(variant 0)")
        return image

    async def close(self) -> None:
        """Shutdown: forget every image and refuse new ones."""
        self._closed = True
        self.images.clear()
