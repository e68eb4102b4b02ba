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

Parts with a ``filename`` are uploads (:class:`Upload`); the others are text fields. Uploads are
held in memory (the body limit bounds them); what they may carry is the media policy's to judge
(the route turns each into a ``data:`` URL and checks it with the chat media limits).

Why not Starlette's ``request.form()`` (python-multipart), measured with
``benchmarks/multipart_parsers.py`` on the two-core machine: this parser takes half the CPU for
an upload (8 MiB: 6.8 ms against 17.6 ms; 64 MiB: 71 ms against 142 ms) at the same peak memory
(one copy of the upload: a view into the body read here, a spooled temporary file read back
there); Starlette's is 2 ms cheaper for 500 small fields. Using it would add a dependency, answer
its limits as ``{"detail": ...}`` rather than Omni's error shape, and need ``read_body``'s size,
deadline and budget wrapped around its stream. docs/development.md has the figures.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field
from email.message import Message

from starlette.requests import Request

from sglang_omni.errors import BadRequest, UnsupportedMediaType
from sglang_omni.serve.bodies.request_body import THREAD_PARSE_BYTES, read_body, settings_of

MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
#: Most parts one form may hold (the native routes take about fifty fields).
MAX_FORM_PARTS = 512
#: Largest head (the part's header lines) of one part, in bytes.
MAX_PART_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True)
class Upload:
    """An uploaded file: its form field, file name, declared type and bytes (a view into the
    body read, not a copy of it)."""

    name: str
    filename: str
    content_type: str | None
    data: bytes | memoryview = field(repr=False)


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


def _next_delimiter(raw: bytes, delimiter: bytes, start: int) -> int:
    """Where the next boundary line starts: the delimiter followed by CRLF or ``--`` (the same
    bytes inside a part followed by anything else are data)."""
    end = raw.find(delimiter, start)
    while end >= 0 and raw[end + len(delimiter):end + len(delimiter) + 2] not in (b"\r\n",
                                                                                   b"--"):
        end = raw.find(delimiter, end + 1)
    return end


def parse_form(raw: bytes, boundary: bytes) -> Form:
    """Split a multipart body into its fields and uploads; 400 naming what is malformed."""
    delimiter = b"--" + boundary
    start = raw.find(delimiter)
    if start < 0:
        raise BadRequest("the form body holds no part (its boundary never appears)")
    fields: list[tuple[str, str]] = []
    files: list[Upload] = []
    view = memoryview(raw)  # an upload's bytes are a slice of the body, not a copy
    position = start + len(delimiter)
    index = 0
    while True:
        if raw[position:position + 2] == b"--":
            return Form(fields, files)
        if raw[position:position + 2] != b"\r\n":
            raise BadRequest("the form body is malformed: a boundary line must end with CRLF")
        if index >= MAX_FORM_PARTS:
            raise BadRequest(f"the form holds more than {MAX_FORM_PARTS} parts; send fewer "
                             "fields")
        head_end = raw.find(b"\r\n\r\n", position + 2, position + 2 + MAX_PART_HEAD_BYTES + 4)
        if head_end < 0:
            raise BadRequest(f"form part {index}: its header lines are missing or longer than "
                             f"{MAX_PART_HEAD_BYTES} bytes")
        name, filename, content_type = _part_head(raw[position + 2:head_end], index)
        end = _next_delimiter(raw, b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise BadRequest(f"{name}: the form body ends inside this part (no closing "
                             "boundary); send the whole form")
        if filename is not None:
            files.append(Upload(name, filename, content_type, view[head_end + 4:end]))
        else:
            try:
                fields.append((name, raw[head_end + 4:end].decode("utf-8")))
            except UnicodeDecodeError:
                raise BadRequest(f"{name}: the form field is not valid UTF-8 text; send text "
                                 "fields as UTF-8, files with a filename") from None
        position = end + 2 + len(delimiter)
        index += 1


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
    boundary = boundary_of(content_type)
    raw = await read_body(request, settings_of(request))
    if len(raw) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(parse_form, raw, boundary)
    return parse_form(raw, boundary)
