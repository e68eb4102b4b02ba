"""Inline media: ``data:`` URLs and bare base64 payloads.

Only base64 ``data:`` URLs are accepted (``data:[<mime>][;param...];base64,<payload>``), as native
SGLang only decodes those. The decoded size is computed from the payload length before decoding,
so an oversized payload is refused without allocating it; decoding is strict (standard alphabet,
correct padding, no whitespace), matching native SGLang's ``validate=True``.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass

_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_MIME_RE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")


class InlineRejected(ValueError):
    """An inline payload outside the accepted forms; the message states the rule."""


@dataclass(frozen=True)
class InlinePayload:
    """A base64 payload and its declared MIME type (lowercase; ``None`` when not declared)."""

    payload: str
    mime: str | None

    @property
    def decoded_size(self) -> int:
        """Exact size in bytes of the decoded payload (valid base64 assumed)."""
        return decoded_size(self.payload)


def decoded_size(payload: str) -> int:
    """Size of the bytes a strict base64 ``payload`` decodes to, without decoding it."""
    return len(payload) // 4 * 3 - payload[-2:].count("=")


def is_base64(text: str) -> bool:
    """Whether ``text`` is non-empty strict base64 (the form native SGLang decodes)."""
    if not text or len(text) % 4 or not text.isascii():
        return False
    data = text.encode("ascii")  # a table lookup per byte: twice as fast as a regex
    pad = 2 if data.endswith(b"==") else 1 if data.endswith(b"=") else 0
    return not data.translate(None, _B64_ALPHABET + b"=") and data.count(b"=") == pad


def parse_data_url(ref: str) -> InlinePayload:
    """Split a ``data:`` URL into its base64 payload and MIME type; refuse other forms.

    The payload is not validated here (check its size first, then :func:`is_base64`).
    """
    if not ref[:5].lower() == "data:":
        raise InlineRejected("not a data: URL")
    comma = ref.find(",", 5)
    if comma < 0:
        raise InlineRejected("data: URLs need a ',' before the payload")
    header, payload = ref[5:comma], ref[comma + 1:]  # one copy of a payload of megabytes
    params = [p.strip().lower() for p in header.split(";")]
    if params[-1] != "base64":
        raise InlineRejected("data: URLs must be base64-encoded (data:<mime>;base64,<payload>)")
    mime = params[0] or None
    if mime is not None and not _MIME_RE.match(mime):
        raise InlineRejected(f"data: URL has an invalid media type {params[0]!r}")
    return InlinePayload(payload=payload, mime=mime)


def decode(payload: InlinePayload) -> bytes:
    """Decode a strict base64 payload; raises :class:`InlineRejected` when it is not one."""
    try:
        return binascii.a2b_base64(payload.payload, strict_mode=True)
    except binascii.Error as e:
        raise InlineRejected(f"the payload is not valid base64 ({e})") from None
