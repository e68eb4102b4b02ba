"""Inline media: ``data:`` URLs and bare base64 payloads.

Only base64 ``data:`` URLs are accepted (``data:[<mime>][;param...];base64,<payload>``), as native
SGLang only decodes those. The decoded size is computed from the payload length before decoding,
so an oversized payload is refused without allocating it; decoding is strict (standard alphabet,
correct padding, no whitespace), matching native SGLang's ``validate=True``.
"""

from __future__ import annotations

import binascii
import io
import re
from dataclasses import dataclass

_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: Characters of a payload checked at a time.
_WINDOW = 1024 * 1024
_MIME_RE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")


class InlineRejected(ValueError):
    """An inline payload outside the accepted forms; the message states the rule."""


@dataclass(frozen=True)
class InlinePayload:
    """A base64 payload and its declared MIME type (lowercase; ``None`` when not declared):
    ``text[start:]`` (the reference itself, so that a payload of megabytes is not copied to
    be judged)."""

    text: str
    mime: str | None
    start: int = 0

    @property
    def payload(self) -> str:
        """The base64 payload (a copy, unless it is the whole reference)."""
        return self.text[self.start:] if self.start else self.text

    def head(self, chars: int) -> str:
        """The payload's first ``chars`` characters."""
        return self.text[self.start:self.start + chars]

    @property
    def decoded_size(self) -> int:
        """Exact size in bytes of the decoded payload (valid base64 assumed)."""
        size = len(self.text) - self.start
        return size // 4 * 3 - self.text[max(self.start, len(self.text) - 2):].count("=")

    def is_base64(self) -> bool:
        """Whether the payload is strict base64 (:func:`is_base64`)."""
        return is_base64(self.text, self.start)


def decoded_size(payload: str) -> int:
    """Size of the bytes a strict base64 ``payload`` decodes to, without decoding it."""
    return InlinePayload(payload, None).decoded_size


def is_base64(text: str, start: int = 0) -> bool:
    """Whether ``text[start:]`` is non-empty strict base64 (the form native SGLang decodes).
    Checked a window at a time, so a payload of megabytes is not copied whole."""
    size = len(text) - start
    if size <= 0 or size % 4 or not text.isascii():
        return False
    pad = 2 if text.endswith("==") and size >= 2 else 1 if text.endswith("=") else 0
    equals = 0
    for at in range(start, len(text), _WINDOW):
        data = text[at:at + _WINDOW].encode("ascii")  # a table lookup per byte: twice
        if data.translate(None, _B64_ALPHABET + b"="):   # as fast as a regex
            return False
        equals += data.count(b"=")
    return equals == pad


def parse_data_url(ref: str) -> InlinePayload:
    """Split a ``data:`` URL into its base64 payload and MIME type; refuse other forms.

    The payload is not validated here (check its size first, then :func:`is_base64`).
    """
    if not ref[:5].lower() == "data:":
        raise InlineRejected("not a data: URL")
    comma = ref.find(",", 5)
    if comma < 0:
        raise InlineRejected("data: URLs need a ',' before the payload")
    header = ref[5:comma]
    params = [p.strip().lower() for p in header.split(";")]
    if params[-1] != "base64":
        raise InlineRejected("data: URLs must be base64-encoded (data:<mime>;base64,<payload>)")
    mime = params[0] or None
    if mime is not None and not _MIME_RE.match(mime):
        raise InlineRejected(f"data: URL has an invalid media type {params[0]!r}")
    return InlinePayload(ref, mime, comma + 1)


def inline_payload(text: str) -> InlinePayload:
    """The payload of an inline value that is a ``data:`` URL or bare base64 (the action route's
    ``{"b64_json": ...}``); :class:`InlineRejected` for another ``data:`` form."""
    if text[:5].lower() == "data:":
        return parse_data_url(text)
    return InlinePayload(text, None)


def decode(payload: InlinePayload) -> bytes:
    """Decode a strict base64 payload; raises :class:`InlineRejected` when it is not one."""
    try:
        return binascii.a2b_base64(payload.payload, strict_mode=True)
    except binascii.Error as e:
        raise InlineRejected(f"the payload is not valid base64 ({e})") from None


class Base64Reader(io.RawIOBase):
    """The bytes a strict base64 payload decodes to, as a read-only seekable file decoded as it
    is read (a few kilobytes at a time), so a parser can read megabytes of inline media without
    a decoded copy of them. The payload must be strict base64 (:meth:`InlinePayload.is_base64`)."""

    def __init__(self, payload: InlinePayload) -> None:
        super().__init__()
        self._text, self._start = payload.text, payload.start
        self._size = payload.decoded_size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        wanted = min(len(buffer), self._size - self._pos)
        if wanted <= 0:
            return 0
        first, last = self._pos // 3, -(-(self._pos + wanted) // 3)  # 4-character groups
        decoded = binascii.a2b_base64(self._text[self._start + 4 * first:self._start + 4 * last])
        skip = self._pos - 3 * first
        data = decoded[skip:skip + wanted]
        memoryview(buffer).cast("B")[:len(data)] = data
        self._pos += len(data)
        return len(data)
