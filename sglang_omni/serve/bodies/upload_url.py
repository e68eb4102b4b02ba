"""An uploaded file as a ``data:`` URL, made as its bytes arrive.

:class:`UrlBuilder` takes an upload's bytes in any pieces (:meth:`~UrlBuilder.feed`) and encodes
them a window at a time, whole 3-byte groups (so the windows' base64 join up), dropping each
window's bytes once encoded: the peak is the URL's text (4/3 of the upload) and one window, never
the upload beside its text. The URL's type is the part's, else the one its leading bytes show,
else guessed from its file name (a name's type is never checked against the bytes).
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Generator

from sglang_omni.media.sniff import HEAD_BYTES, MIME_OF_FORMAT, sniff_format
from sglang_omni.serve.bodies.growing_text import growing_text

#: Bytes of an upload encoded at a time (a multiple of 3).
ENCODE_WINDOW = 3 * 64 * 1024


def upload_mime(content_type: str | None, filename: str, head: bytes) -> str:
    """The type of an upload's data URL: its part's Content-Type, else the one its leading
    bytes ``head`` show, else guessed from ``filename``."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime and mime != "application/octet-stream":
        return mime
    found = sniff_format(head[:HEAD_BYTES])
    if found is not None:
        return MIME_OF_FORMAT[found][0]
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


class UrlBuilder:
    """The ``data:`` URL of one upload, built as its bytes are fed (see the module contract)."""

    def __init__(self, content_type: str | None, filename: str,
                 window: int = ENCODE_WINDOW) -> None:
        self._content_type = content_type
        self._filename = filename
        self._window = max(3, window - window % 3)
        self._pending = bytearray()
        self._text: Generator[str | None, str | None, None] | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the upload's next bytes; encode whole windows of them."""
        self._pending += data
        if len(self._pending) >= self._window:
            self._encode(len(self._pending) - len(self._pending) % 3)

    def finish(self) -> str:
        """The whole URL (the last bytes padded as base64 pads them)."""
        self._encode(len(self._pending))
        text = self._started().send(None)
        assert text is not None
        self._text = None
        return text

    def _started(self) -> Generator[str | None, str | None, None]:
        if self._text is None:
            mime = upload_mime(self._content_type, self._filename,
                               bytes(self._pending[:HEAD_BYTES]))
            self._text = growing_text(f"data:{mime};base64,")
            next(self._text)
        return self._text

    def _encode(self, size: int) -> None:
        text = self._started()
        if size:
            with memoryview(self._pending) as view, view[:size] as window:
                piece = base64.b64encode(window)
            text.send(piece.decode("ascii"))
            del piece, self._pending[:size]


def data_url_of(content_type: str | None, filename: str, data: bytes | memoryview,
                window: int = ENCODE_WINDOW) -> str:
    """The ``data:`` URL of an upload's bytes held whole."""
    view = memoryview(data)
    builder = UrlBuilder(content_type, filename, window)
    for at in range(0, len(view), window):
        builder.feed(view[at:at + window])
    return builder.finish()


#: The builder run a few times at import (its own paths warmed, as growing_text warms its
#: appends), so that the first upload is not copied either.
_WARM = [data_url_of("a/b", "", b"abcdef" * 8, 3) for _ in range(4)]
