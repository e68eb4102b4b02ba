"""Read a ``multipart/form-data`` request body, bounded like every body Omni reads.

Contract of :func:`read_form`, checked in this order, before any work is done:

* the Content-Type is ``multipart/form-data`` with a ``boundary`` (or
  ``application/x-www-form-urlencoded``, a form without uploads) -> else 415 (another type) or
  400 (no boundary);
* the body is at most ``server.max_body_bytes`` and arrives within ``server.body_timeout_s``
  (the same reader as JSON bodies: :func:`~sglang_omni.serve.bodies.request_body.read_body`) -> else
  413 or 408;
* it holds at most :data:`MAX_FORM_PARTS` parts, each with a ``Content-Disposition: form-data``
  header naming the field and a head of at most :data:`MAX_PART_HEAD_BYTES`; text fields are
  UTF-8 -> else 400 naming the field.

Parts with a ``filename`` are uploads (:class:`Upload`); the others are text fields. The form is
parsed as the body arrives (:class:`FormReader`), and each upload is made its ``data:`` URL as its
bytes arrive, a window at a time (:mod:`.upload_url`), so the raw body is never held whole beside
the URLs' text (the peak is about 1.34x the body: the text, 4/3 of the uploads, and a window).
What an upload may carry is the media policy's to judge (the route checks its URL with the chat
media limits).

Why not Starlette's ``request.form()`` (python-multipart), measured with
``benchmarks/multipart_parsers.py`` on the two-core machine: this parser takes half the CPU for
an upload (8 MiB: 6.8 ms against 17.6 ms; 64 MiB: 71 ms against 142 ms) at the same peak memory
as it had then (one copy of the upload: a view into the body read whole, a spooled temporary
file read back there; this parser now holds only the upload's text); Starlette's is 2 ms
cheaper for 500 small fields. Using it would add a dependency, answer its limits as
``{"detail": ...}`` rather than Omni's error shape, and need ``read_body``'s size, deadline and
budget wrapped around its stream. docs/development.md has the figures.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from email.message import Message

from starlette.requests import Request

from sglang_omni.errors import BadRequest, UnsupportedMediaType
from sglang_omni.serve.bodies.request_body import read_body, settings_of, stream_batches
from sglang_omni.serve.bodies.upload_url import UrlBuilder

MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
#: Most parts one form may hold (the native routes take about fifty fields).
MAX_FORM_PARTS = 512
#: Largest head (the part's header lines) of one part, in bytes.
MAX_PART_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True)
class Upload:
    """An uploaded file: its form field, file name and declared type, and either its ``data:``
    URL (``url``, as :func:`read_form` makes it while the bytes arrive) or its bytes
    (``data``)."""

    name: str
    filename: str
    content_type: str | None
    data: bytes | memoryview = field(default=b"", repr=False)
    url: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Form:
    """A parsed form: text fields and uploads, each in the order sent."""

    fields: list[tuple[str, str]]
    files: list[Upload]


def _header_param(header: str, value: str, param: str) -> str | None:
    message = Message()
    message[header] = value
    found = message.get_param(param, header=header)
    if isinstance(found, tuple):  # RFC 2231: (charset, language, text)
        found = found[2]
    return None if found is None else str(found)


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; 415/400 otherwise."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime != MULTIPART:
        raise UnsupportedMediaType(f"Content-Type: {mime!r} is not a form; send "
                                   f"{MULTIPART} (curl: -F 'field=value' -F 'file=@path')")
    boundary = _header_param("content-type", content_type, "boundary")
    if not boundary or len(boundary) > 200:
        raise BadRequest(f"Content-Type: {MULTIPART} needs a boundary parameter of 1 to 200 "
                         "characters (HTTP clients set it themselves for a form)")
    return boundary.encode("latin-1", errors="replace")


def _part_head(head: bytes, index: int) -> tuple[str, str | None, str | None]:
    """(field name, file name or None, content type or None) of one part's head."""
    disposition = content_type = None
    for line in head.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"form part {index}: malformed header line {line[:60]!r}")
        key = name.strip().lower()
        if key == "content-disposition":
            disposition = value.strip()
        elif key == "content-type":
            content_type = value.strip() or None
    if disposition is None or disposition.split(";", 1)[0].strip().lower() != "form-data":
        raise BadRequest(f"form part {index}: needs a 'Content-Disposition: form-data; "
                         "name=...' header")
    field_name = _header_param("content-disposition", disposition, "name")
    if not field_name:
        raise BadRequest(f"form part {index}: Content-Disposition names no field")
    return field_name, _header_param("content-disposition", disposition, "filename"), \
        content_type


_PREAMBLE, _LINE, _HEAD, _DATA, _DONE = range(5)
#: Bytes of a body handed to :class:`FormReader` at a time by :func:`parse_form`.
_FEED_BYTES = 64 * 1024


class FormReader:
    """Parses a multipart body as its chunks arrive (:meth:`feed`, then :meth:`finish`).

    An upload is made its ``data:`` URL as its bytes arrive (:class:`.UrlBuilder`), so the body
    is never held whole beside the text: the peak is the forms' text and about a window. The
    first malformed part is remembered and the rest of the body dropped unread;
    :meth:`finish` raises it (so the body reader's own 413 and 408 still come first, as when the
    body was read whole before it was parsed)."""

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"--" + boundary
        self._needle = b"\r\n" + self._delimiter  # a boundary line inside the body
        self._buf = bytearray()
        self._state = _PREAMBLE
        self._index = 0
        self._name = ""
        self._text = bytearray()
        self._upload: tuple[str, str | None, UrlBuilder] | None = None
        self._fields: list[tuple[str, str]] = []
        self._files: list[Upload] = []
        self._error: BadRequest | None = None

    def feed_all(self, chunks: list[bytes]) -> None:
        """:meth:`feed` each of ``chunks``, emptying the list as it goes."""
        chunks.reverse()
        while chunks:
            self.feed(chunks.pop())

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the body's next bytes and parse what they complete."""
        if self._error is not None or self._state == _DONE:
            return
        self._buf += chunk
        try:
            self._parse(final=False)
        except BadRequest as exc:
            self._error = exc
            self._buf, self._text, self._upload = bytearray(), bytearray(), None

    def finish(self) -> Form:
        """The form, once the whole body was fed; 400 naming what is malformed."""
        if self._error is None and self._state != _DONE:
            try:
                self._parse(final=True)
            except BadRequest as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return Form(self._fields, self._files)

    def _parse(self, final: bool) -> None:
        while self._state != _DONE:
            step = {_PREAMBLE: self._preamble, _LINE: self._line, _HEAD: self._head,
                    _DATA: self._data}[self._state]
            if not step(final):
                return

    def _preamble(self, final: bool) -> bool:
        buf = self._buf
        at = buf.find(self._delimiter)
        if at < 0:
            if final:
                raise BadRequest("the form body holds no part (its boundary never appears)")
            del buf[:max(0, len(buf) - len(self._delimiter) + 1)]
            return False
        del buf[:at + len(self._delimiter)]
        self._state = _LINE
        return True

    def _line(self, final: bool) -> bool:
        """The end of a boundary line: CRLF before a part, ``--`` after the last."""
        buf = self._buf
        if len(buf) < 2 and not final:
            return False
        if buf[:2] == b"--":
            self._state = _DONE
            self._buf = bytearray()
            return False
        if buf[:2] != b"\r\n":
            raise BadRequest("the form body is malformed: a boundary line must end with CRLF")
        if self._index >= MAX_FORM_PARTS:
            raise BadRequest(f"the form holds more than {MAX_FORM_PARTS} parts; send fewer "
                             "fields")
        del buf[:2]
        self._state = _HEAD
        return True

    def _head(self, final: bool) -> bool:
        buf = self._buf
        limit = MAX_PART_HEAD_BYTES + 4
        end = buf.find(b"\r\n\r\n", 0, limit)
        if end < 0:
            if final or len(buf) >= limit:
                raise BadRequest(f"form part {self._index}: its header lines are missing or "
                                 f"longer than {MAX_PART_HEAD_BYTES} bytes")
            return False
        name, filename, content_type = _part_head(bytes(buf[:end]), self._index)
        del buf[:end + 4]
        self._name = name
        self._upload = None if filename is None else \
            (filename, content_type, UrlBuilder(content_type, filename))
        self._state = _DATA
        return True

    def _data(self, final: bool) -> bool:
        """A part's bytes up to the next boundary line: the delimiter followed by CRLF or
        ``--`` (the same bytes followed by anything else are data)."""
        buf, needle = self._buf, self._needle
        start = 0
        while True:
            at = buf.find(needle, start)
            after = at + len(needle)
            if at < 0 or len(buf) < after + 2:
                if final:
                    raise BadRequest(f"{self._name}: the form body ends inside this part (no "
                                     "closing boundary); send the whole form")
                # bytes before where a boundary line may yet start are the part's
                self._take(at if at >= 0 else max(0, len(buf) - len(needle) - 1))
                return False
            if buf[after:after + 2] in (b"\r\n", b"--"):
                break
            start = at + 1
        self._take(at)
        del buf[:len(needle)]
        self._end_part()
        self._index += 1
        self._state = _LINE
        return True

    def _take(self, size: int) -> None:
        """Move the buffer's first ``size`` bytes into the current part."""
        if not size:
            return
        if self._upload is not None:
            self._upload[2].feed(self._buf[:size])
        else:
            self._text += self._buf[:size]
        del self._buf[:size]

    def _end_part(self) -> None:
        if self._upload is not None:
            filename, content_type, builder = self._upload
            self._upload = None
            self._files.append(Upload(self._name, filename, content_type, url=builder.finish()))
            return
        text, self._text = self._text, bytearray()
        try:
            self._fields.append((self._name, text.decode("utf-8")))
        except UnicodeDecodeError:
            raise BadRequest(f"{self._name}: the form field is not valid UTF-8 text; send text "
                             "fields as UTF-8, files with a filename") from None


def parse_form(raw: bytes, boundary: bytes) -> Form:
    """Split a multipart body held whole into its fields and uploads; 400 naming what is
    malformed."""
    reader = FormReader(boundary)
    view = memoryview(raw)
    for at in range(0, len(view), _FEED_BYTES):
        reader.feed(view[at:at + _FEED_BYTES])
    return reader.finish()


def parse_urlencoded(raw: bytes) -> Form:
    """A URL-encoded form (text fields only); 400 when it is not UTF-8 or has too many
    fields."""
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("ascii"), keep_blank_values=True,
                                       strict_parsing=False, errors="strict",
                                       max_num_fields=MAX_FORM_PARTS)
    except UnicodeDecodeError:
        raise BadRequest("the form is not URL-encoded UTF-8 text; percent-encode UTF-8") from None
    except ValueError as exc:
        raise BadRequest(f"the form is malformed: {exc}; send at most {MAX_FORM_PARTS} "
                         "fields of UTF-8 text") from None
    return Form(pairs, [])


async def read_form(request: Request) -> Form:
    """The parsed form of a request (see the module contract; a URL-encoded form, which holds
    no uploads, is read too)."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() == URLENCODED:
        return parse_urlencoded(await read_body(request, settings_of(request)))
    reader = FormReader(boundary_of(content_type))
    await stream_batches(request, settings_of(request), reader.feed_all)
    return reader.finish()
