"""Media types the server moves inline: the accepted MIME types per kind, the inline size
limit, and the sniffer that tells a type from its leading bytes."""

from __future__ import annotations

INLINE_LIMIT = 8 * 1024 * 1024
"""The largest media item (bytes) carried inline in a response or a stage payload."""

MIME_BY_KIND: dict[str, tuple[str, ...]] = {
    "image": ("image/png", "image/jpeg", "image/webp"),
    "video": ("video/mp4",),
}
"""The MIME types accepted for each media kind, in order of preference."""


def sniff_mime(data: bytes) -> str | None:
    """The media type the leading bytes show: image/png, image/jpeg, image/webp, video/mp4."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if len(data) >= 12 and data[4:8] == b"ftyp":
        return "video/mp4"
    return None


def media_type_of(kind: str, data: bytes | bytearray) -> str | None:
    """The MIME type of ``data`` when its bytes are media of ``kind``; None otherwise."""
    mime = sniff_mime(bytes(data[:16]))
    return mime if mime in MIME_BY_KIND.get(kind, ()) else None
