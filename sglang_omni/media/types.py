"""Media types the server moves inline: the accepted MIME types per kind, the inline size
limit, and the sniffer that tells a type from its leading bytes."""

from __future__ import annotations

from sglang_omni.media.sniff import HEAD_BYTES, MIME_OF_FORMAT, sniff_format

INLINE_LIMIT = 8 * 1024 * 1024
"""The largest media item (bytes) carried inline in a response or a stage payload."""

MIME_BY_KIND: dict[str, tuple[str, ...]] = {
    "image": ("image/png", "image/jpeg", "image/webp"),
    "video": ("video/mp4",),
}
"""The MIME types accepted for each media kind, in order of preference."""


def sniff_mime(data: bytes) -> str | None:
    """The media type the leading bytes show among those moved inline (``MIME_BY_KIND``):
    image/png, image/jpeg, image/webp, video/mp4; None for any other (magic numbers:
    ``media.sniff``)."""
    found = sniff_format(data[:HEAD_BYTES])
    mime = MIME_OF_FORMAT[found][0] if found is not None else None
    return mime if any(mime in mimes for mimes in MIME_BY_KIND.values()) else None


def media_type_of(kind: str, data: bytes | bytearray) -> str | None:
    """The MIME type of ``data`` when its bytes are media of ``kind``; None otherwise."""
    mime = sniff_mime(bytes(data[:16]))
    return mime if mime in MIME_BY_KIND.get(kind, ()) else None
