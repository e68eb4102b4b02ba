"""OpenAI-style chat messages to what a transformers processor takes.

Text parts stay text; ``image_url`` and ``video_url`` parts become ``{"type": "image"}`` and
``{"type": "video"}`` placeholders for the chat template, and their media are read (inline frames
from the job, which an interleaved request's stage keeps for the request, everything else under
the media policy, a few at a time and all within the request's media deadline) into
:class:`MediaItem` s named by the sha256 of their bytes, in conversation order, which is the order
the processor expands the placeholders in. An item is decoded only when its features are not
kept already (``MediaItem.decoded``).
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.contract.job import Job
from sglang_omni.errors import BadRequest
from sglang_omni.media import LazyMediaDir, MediaPolicy, load_bytes
from sglang_omni.media.content_parts import ContentPart, message_parts
from sglang_omni.media.gather import gather_within


@dataclass
class Video:
    """Decoded RGB frames (T, H, W, 3) uint8 and the frame rate they play at."""

    frames: Any
    fps: float


@dataclass
class MediaItem:
    """An image or video part: ``kind``, the sha256 of its bytes, the bytes, and the label its
    errors name. ``decoded()`` is the PIL image or :class:`Video` (decoded once)."""

    kind: str
    digest: str
    data: bytes | None = None
    label: str = ""
    value: Any = None

    def decoded(self) -> Any:
        """BadRequest when the bytes are not a readable image or video."""
        if self.value is None:
            assert self.data is not None
            decode = decode_image if self.kind == "image" else decode_video
            self.value = decode(self.data, self.label or self.kind)
        return self.value


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    media: list[MediaItem] = field(default_factory=list)


async def read_conversation(job: Job, policy: MediaPolicy) -> Conversation:
    """The job's messages with every media part read (BadRequest on bad media, decoded
    later). The parts are read a few at a time, all within the policy's
    ``request_deadline_s`` (:func:`~sglang_omni.media.gather.gather_within`: a request over it
    fails like a fetch that times out)."""
    conversation = Conversation([])
    reads: list[tuple[str, Callable[[], Awaitable[MediaItem]]]] = []
    with LazyMediaDir() as workdir:  # made only when a part is not one of the job's frames
        offset = int(job.payload.get("message_offset", 0))  # labels name the client's index
        for i, message in enumerate(job.payload.get("messages") or []):
            if not isinstance(message, dict):
                raise BadRequest(f"messages[{i - offset}]: expected an object")
            content = message.get("content")
            if not isinstance(content, list):
                conversation.messages.append({"role": message.get("role", "user"),
                                              "content": "" if content is None else str(content)})
                continue
            parts: list[dict[str, Any]] = []
            for part in message_parts(i - offset, content):
                if part.kind == "text":
                    parts.append({"type": "text", "text": part.text})
                elif part.kind in ("image", "video"):
                    reads.append((part.label, functools.partial(_read_media, job, part, policy,
                                                                workdir)))
                    parts.append({"type": part.kind})
            conversation.messages.append({"role": message.get("role", "user"),
                                          "content": parts})
        conversation.media = await gather_within(reads, policy)
    return conversation


async def _read_media(job: Job, part: ContentPart, policy: MediaPolicy,
                      workdir: LazyMediaDir) -> MediaItem:
    """An image or video part's item (decoded later, when needed)."""
    import anyio

    url, label = part.url or "", part.label
    data = job.frame_for(url)
    if data is None:
        data = await load_bytes(url, policy, workdir.get(), label=label)
    data = bytes(data)
    digest = await anyio.to_thread.run_sync(_sha256, data)
    return MediaItem(str(part.kind), digest, data, label)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode_image(data: bytes, label: str = "image") -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise BadRequest(f"{label}: not a readable image ({exc})") from None


def decode_video(data: bytes, label: str = "video") -> Video:
    """All frames of a video file as RGB arrays, with its average frame rate."""
    import av
    import numpy as np

    try:
        with av.open(io.BytesIO(data), "r") as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.base_rate or 24
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except (av.FFmpegError, IndexError, ValueError) as exc:
        raise BadRequest(f"{label}: not a readable video ({exc})") from None
    if not frames:
        raise BadRequest(f"{label}: the video has no frames")
    return Video(np.stack(frames), float(rate))
