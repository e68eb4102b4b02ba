"""Result types of the SDK: segments, completion results and streamed chunks."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MediaData:
    """A media segment's data. ``url`` is a ``data:`` URL with the bytes (None in references)."""

    kind: str
    mime_type: str
    size_bytes: int
    sha256: str
    url: str | None = None

    def content(self) -> bytes:
        """The media bytes, checked against ``size_bytes`` and ``sha256``."""
        if not self.url or not self.url.startswith("data:"):
            raise ValueError("this segment is a reference without data")
        data = base64.b64decode(self.url.split(",", 1)[1])
        if len(data) != self.size_bytes or hashlib.sha256(data).hexdigest() != self.sha256:
            raise ValueError("the media bytes do not match size_bytes/sha256")
        return data

    def save(self, path: str | Path) -> Path:
        """Write the bytes to ``path`` (the caller owns the file)."""
        target = Path(path)
        target.write_bytes(self.content())
        return target


@dataclass(frozen=True)
class Segment:
    """One ordered output: ``kind`` is text, image or video; ``data`` is the text (None in a
    reference) or ``MediaData``."""

    execution_id: str
    segment_index: int
    kind: str
    data: str | MediaData | None

    @property
    def text(self) -> str | None:
        return self.data if isinstance(self.data, str) else None

    @property
    def media(self) -> MediaData | None:
        return self.data if isinstance(self.data, MediaData) else None

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Segment:
        raw = body.get("data")
        data: str | MediaData | None
        if isinstance(raw, dict):
            data = MediaData(raw["kind"], raw["mime_type"], int(raw["size_bytes"]),
                             raw["sha256"], raw.get("url"))
        else:
            data = raw
        return cls(str(body["execution_id"]), int(body["segment_index"]), str(body["kind"]),
                   data)


@dataclass(frozen=True)
class UMMCompletionResult:
    """A finished interleaved request: the joined text and every segment with its data."""

    id: str
    text: str
    segments: list[Segment]
    finish_reason: str
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UMMGenerateChunk:
    """One streamed event: ``event`` is ``segment`` (``segment`` set), ``complete``
    (``finish_reason``, ``segments`` as references and ``usage`` set) or, with
    ``progress=True``, ``progress`` (``progress`` set: the server's progress object, see
    docs/interleaved.md)."""

    event: str
    segment: Segment | None = None
    progress: dict[str, Any] | None = None
    finish_reason: str | None = None
    segments: list[Segment] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)


class OmniClientError(Exception):
    """The server refused or failed the request; ``status`` is its HTTP status or error code."""

    def __init__(self, status: int, message: str, type_: str = "") -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status = status
        self.message = message
        self.type = type_


class GenerationCancelled(Exception):
    """The caller cancelled a generation; the server aborted it."""
