"""Set a msgpack body's long strings aside while it arrives, so it is held about once.

:class:`StringSplitter` reads the msgpack byte stream as it is fed (only the headers of its
values: containers are counted by the unpacker later, not here) and copies it into its ``text``,
except each string of at least :data:`MIN_STRING` bytes: that is decoded as its bytes arrive
into a string set aside (``strings``), and stands in the text as a placeholder (an ext value of
:data:`EXT_CODE` holding a random key and its index). Its ``ext_hook``, given to the unpacker of
the text, puts each string back in its place: the peak is the strings, the rest of the body and
a chunk, never the body's bytes beside its strings.

What the splitter does not read (a byte no msgpack value starts with) is copied through as it is,
so the unpacker reports it as before; a body that ends inside a string set aside is refused here
with the unpacker's own words ("incomplete input").
"""

from __future__ import annotations

import codecs
import os
import struct
from collections.abc import Generator
from typing import Any

import msgpack

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.growing_text import growing_text

#: Strings of at least this many bytes are set aside.
MIN_STRING = 64 * 1024
#: The ext type code of a placeholder (any code: a client's ext of this code without the
#: splitter's random key stays an ext value).
EXT_CODE = 77
_PLACEHOLDER = struct.Struct(">16sI")

#: Lead byte -> (header bytes, how the length follows: struct format or None, kind). Kinds:
#: "s" a string, "b" bin, "e" ext (its type byte after the length), "" a value whose payload is
#: fixed (``header`` counts it) or a container (its items are values of their own).
_HEADERS: dict[int, tuple[int, str | None, str]] = {
    0xc0: (1, None, ""), 0xc2: (1, None, ""), 0xc3: (1, None, ""),
    0xc4: (2, ">B", "b"), 0xc5: (3, ">H", "b"), 0xc6: (5, ">I", "b"),
    0xc7: (3, ">B", "e"), 0xc8: (4, ">H", "e"), 0xc9: (6, ">I", "e"),
    0xca: (5, None, ""), 0xcb: (9, None, ""),
    0xcc: (2, None, ""), 0xcd: (3, None, ""), 0xce: (5, None, ""), 0xcf: (9, None, ""),
    0xd0: (2, None, ""), 0xd1: (3, None, ""), 0xd2: (5, None, ""), 0xd3: (9, None, ""),
    0xd4: (3, None, ""), 0xd5: (4, None, ""), 0xd6: (6, None, ""), 0xd7: (10, None, ""),
    0xd8: (18, None, ""),
    0xd9: (2, ">B", "s"), 0xda: (3, ">H", "s"), 0xdb: (5, ">I", "s"),
    0xdc: (3, None, ""), 0xdd: (5, None, ""), 0xde: (3, None, ""), 0xdf: (5, None, ""),
}


def _header(lead: int) -> tuple[int, str | None, str] | None:
    """The header of the value ``lead`` starts (see :data:`_HEADERS`); None for 0xc1."""
    if lead <= 0x9f or lead >= 0xe0:  # fixint, fixmap, fixarray
        return 1, None, ""
    if lead <= 0xbf:  # fixstr: a short string, copied
        return 1, None, "fix"
    return _HEADERS.get(lead)


class StringSplitter:
    """A msgpack body's text with its long strings set aside (see the module contract)."""

    def __init__(self, min_string: int = MIN_STRING,
                 max_values: int = ServerSettings.max_json_values) -> None:
        self.text = bytearray()
        #: Past this many values the unpacker refuses the body anyway (a map member is two):
        #: the rest is copied through unread.
        self._max_headers = 2 * max_values + 2
        self._headers = 0
        self.strings: list[str] = []
        self._min = min_string
        self._key = os.urandom(16)
        self._pending = bytearray()
        self._copy = 0  # payload bytes still to copy through
        self._take = 0  # bytes of the string being set aside still to come
        self._decoder: codecs.IncrementalDecoder | None = None
        self._string: Generator[str | None, str | None, None] | None = None
        self._through = False  # past a byte no value starts with: copy the rest as it is

    def feed_all(self, chunks: list[bytes]) -> None:
        """:meth:`feed` each of ``chunks``, emptying the list as it goes."""
        chunks.reverse()
        while chunks:
            self.feed(chunks.pop())

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the body's next bytes."""
        if self._through:
            self.text += chunk
            return
        self._pending += chunk
        pending = self._pending
        at = 0
        while at < len(pending):
            if self._take:
                size = min(self._take, len(pending) - at)
                self._take_string(pending[at:at + size])
                at += size
                continue
            if self._copy:
                size = min(self._copy, len(pending) - at)
                self.text += pending[at:at + size]
                self._copy -= size
                at += size
                continue
            lead = pending[at]
            header = _header(lead)
            self._headers += 1
            if header is None or self._headers > self._max_headers:
                self._through = True
                self.text += pending[at:]
                at = len(pending)
                break
            size, length_format, kind = header
            if len(pending) - at < size:
                break
            if kind == "fix":
                self._copy = lead & 0x1f
            elif length_format is not None:
                length = struct.unpack_from(length_format, pending, at + 1)[0]
                if kind == "s" and length >= self._min:
                    self._start_string(length)
                    at += size
                    continue
                self._copy = length
            self.text += pending[at:at + size]
            at += size
        del pending[:at]

    def finish(self) -> None:
        """Close the stream: 400 when it ends inside a string set aside."""
        if self._take:
            raise BadRequest("the body is not valid msgpack: Unpack failed: incomplete input")
        self.text += self._pending
        self._pending = bytearray()

    def _start_string(self, length: int) -> None:
        index = len(self.strings)
        self.strings.append("")
        self.text += msgpack.packb(msgpack.ExtType(EXT_CODE, _PLACEHOLDER.pack(self._key, index)))
        self._take = length
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._string = growing_text("")
        next(self._string)

    def _take_string(self, data: bytearray) -> None:
        assert self._decoder is not None and self._string is not None
        self._take -= len(data)
        final = not self._take
        try:
            piece = self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise BadRequest(f"the body is not valid msgpack: a string is not valid UTF-8 "
                             f"({exc.reason})") from None
        self._string.send(piece)
        del piece
        if final:
            text = self._string.send(None)
            assert text is not None
            self.strings[-1] = text
            self._string = self._decoder = None

    def ext_hook(self, code: int, data: bytes) -> Any:
        """The string a placeholder stands for; any other ext value as msgpack gives it."""
        if code == EXT_CODE and len(data) == _PLACEHOLDER.size:
            key, index = _PLACEHOLDER.unpack(data)
            if key == self._key and index < len(self.strings):
                return self.strings[index]
        return msgpack.ExtType(code, data)


def _warm() -> str:
    splitter = StringSplitter(min_string=4)
    raw = msgpack.packb(["abcdefgh" * 4])
    for at in range(len(raw)):
        splitter.feed(raw[at:at + 1])
    splitter.finish()
    return splitter.strings[0]


#: The reader run a few times at import (its own paths warmed, as growing_text warms its
#: appends), so that the first long string is not copied either.
_WARM = [_warm() for _ in range(4)]
