"""Set the base64 payloads of a JSON body aside while it streams in, so it is held about once.

A JSON body of inline media is mostly base64 text. Parsed the plain way it is held three times
at once (the bytes received, their decoded text, the parsed strings). :class:`RunSplitter` takes
the body chunk by chunk and moves every run of at least :data:`MIN_RUN` base64 characters that
opens a JSON string or follows ``;base64,`` (bare base64 media, a ``data:`` URL's payload) out of
the JSON text into a string of its own,
leaving a marker in its place; :meth:`RunSplitter.restore` puts the payloads back into the parsed
value. Contract:

* the parsed and restored value equals ``json.loads`` of the whole body, and a body is valid
  JSON exactly when its reduced text is (in valid JSON, base64 characters right after a quote
  or after ``;`` are inside a string; the marker is made of characters a string may hold and
  JSON text outside one may not; no quote or backslash is removed or added);
* the reduced text has the same commas and brackets as the body (base64 and the marker have
  none), so a count of values made on it holds for the body;
* :meth:`RunSplitter.original_offset` maps an offset in the reduced text to the body's;
* the peak is about the body: a run is gathered in pieces of :data:`PIECE` bytes (each
  allocated whole, its own mapping, given back to the system when freed), and made text (off
  the event loop, in :meth:`RunSplitter.restore`) a piece at a time, each piece dropped as it
  is appended to the payload's text (:func:`grow_text`), so a payload is never held twice.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

#: Payloads shorter than this stay in the JSON text.
MIN_RUN = 1024 * 1024
#: A run is gathered in pieces of this many bytes, each allocated whole: at the server's mmap
#: threshold (``runtime.allocator``), so that each piece goes back to the system as it is freed.
PIECE = 1024 * 1024
_START = b";base64,"
_QUOTE = ord('"')
#: A trailing run this long is checked for where it starts and gathered apart from then on.
_DETECT = 64 * 1024
_NOT_BASE64 = re.compile(rb"[^A-Za-z0-9+/=]")
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


def _all_base64(view: memoryview) -> bool:
    """Whether every byte of ``view`` is a base64 character (a table pass: many times faster
    than the regex, which is only asked where a run ends)."""
    return not view.tobytes().translate(None, _BASE64)


class RunSplitter:
    """Feed a body's chunks with :meth:`feed`, then :meth:`finish`; :attr:`text` is the body
    without its long payloads and :attr:`runs` those payloads, in order."""

    def __init__(self) -> None:
        self.text = bytearray()
        #: The payloads set aside, as their pieces of bytes until :meth:`restore` makes them
        #: text (off the event loop: the caller parses in a thread).
        self.runs: list[list[bytearray] | str] = []
        self._token = secrets.token_hex(8)
        self._run: list[bytearray] | None = None  # the payload being gathered, in pieces
        self._run_size = 0
        self._fill = 0  # bytes of the run's last piece filled
        self._tail = 0  # base64 characters that end text
        self._eligible: bool | None = None  # whether that run may be set aside
        #: (offset in text just past a marker, bytes the body had there beyond the marker)
        self._shifts: list[tuple[int, int]] = []

    def marker(self, index: int) -> str:
        """The text that stands in the reduced body for payload ``index``."""
        return f"@omni-run-{self._token}-{index}@"

    def feed(self, chunk: bytes) -> None:
        """Take the body's next chunk (any size: it is looked at :data:`_DETECT` bytes at a
        time, so a long run inside it is found)."""
        whole = memoryview(chunk)
        for at in range(0, len(whole), _DETECT):
            self._feed(whole[at:at + _DETECT])

    def _feed(self, view: memoryview) -> None:
        if self._run is not None:
            end = None if _all_base64(view) else _NOT_BASE64.search(view)
            stop = len(view) if end is None else end.start()
            self._gather(view[:stop])
            if end is None:
                return
            self._end_run()
            view = view[stop:]
        if _all_base64(view):
            self._tail += len(view)
        else:
            last = _NOT_BASE64.search(view[::-1].tobytes())  # the last byte of no base64
            assert last is not None
            self._tail = last.start()
            self._eligible = None
        self.text += view
        if self._tail < _DETECT:
            return
        start = len(self.text) - self._tail
        if self._eligible is None:
            self._eligible = start > 0 and (self.text[start - 1] == _QUOTE or
                                            self.text[max(0, start - 8):start] == _START)
        if self._eligible:
            self._run, self._run_size = [], 0
            self._gather(memoryview(self.text)[start:])
            del self.text[start:]
            self._tail = 0

    def _gather(self, data: memoryview) -> None:
        """Add ``data`` to the run being gathered, filling its pieces in turn. A piece is
        allocated whole (:data:`PIECE` bytes, a mapping of its own, given back to the system
        when freed): one grown by appends grew in the heap, whose freed middle stays with the
        process, so a 150 MB body's server grew to 1.65x it as its payloads were made text."""
        run = self._run
        assert run is not None
        at, size = 0, len(data)
        while at < size:
            if not run or self._fill == PIECE:
                run.append(bytearray(PIECE))
                self._fill = 0
            n = min(size - at, PIECE - self._fill)
            with data[at:at + n] as part:
                run[-1][self._fill:self._fill + n] = part
            self._fill += n
            at += n
        self._run_size += size
        data.release()

    def finish(self) -> None:
        """The body has ended (a run still open ends with it)."""
        if self._run is not None:
            self._end_run()

    def _end_run(self) -> None:
        run, self._run = self._run, None
        assert run is not None
        if run:
            del run[-1][self._fill:]  # the last piece's room not filled
        self._eligible = None
        if self._run_size < MIN_RUN:
            for piece in run:
                self.text += piece
            self._tail = self._run_size
            self._eligible = False  # this run stays; what follows ends it
            return
        marker = self.marker(len(self.runs)).encode()
        self.runs.append(run)
        self.text += marker
        self._tail = 0
        self._shifts.append((len(self.text), self._run_size - len(marker)))

    def original_offset(self, offset: int) -> int:
        """The body's offset of ``offset`` in :attr:`text` (or in its decoded text: markers
        and payloads are ASCII)."""
        return offset + sum(extra for at, extra in self._shifts if at <= offset)

    def restore(self, value: Any) -> Any:
        """``value`` (parsed from :attr:`text`) with every marker replaced by its payload;
        the payloads are given up as they are placed."""
        if not self.runs:
            return value
        prefix = f"@omni-run-{self._token}-"
        found = re.compile(re.escape(prefix) + r"(\d+)@")

        def take(index: int) -> list[bytearray] | str:
            """Payload ``index`` (its pieces, or its text if it was made already)."""
            run, self.runs[index] = self.runs[index], ""
            return run

        def put_back(text: str) -> str:
            if prefix not in text:
                return text
            parts: list[str | list[bytearray]] = []
            at = 0
            for match in found.finditer(text):
                index = int(match.group(1))
                if index < len(self.runs):
                    parts += [text[at:match.start()], take(index)]
                    at = match.end()
            if not parts:
                return text
            parts.append(text[at:])
            return grow_text(parts)  # the text's own pieces go as the payloads are placed

        if isinstance(value, str):
            return put_back(value)
        stack: list[Any] = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                for i, sub in enumerate(item):
                    if isinstance(sub, str):
                        item[i] = put_back(sub)
                    elif isinstance(sub, dict | list):
                        stack.append(sub)
            elif isinstance(item, dict):
                if any(prefix in key for key in item):
                    pairs = [(put_back(k), v) for k, v in item.items()]
                    item.clear()
                    item.update(pairs)
                for key, sub in item.items():
                    if isinstance(sub, str):
                        item[key] = put_back(sub)
                    elif isinstance(sub, dict | list):
                        stack.append(sub)
        self.runs.clear()
        return value


def grow_text(parts: list[str | list[bytearray]]) -> str:
    """The text of ``parts`` (strings, and payloads as pieces of ASCII bytes), emptying
    ``parts`` and each payload's list as it goes, so a payload's bytes are freed piece by piece
    as its text grows: the peak is the text and one piece, not the text and the payload.

    The text grows in place: CPython appends to a string of which only this frame holds a
    reference without copying it (a realloc, which for a large block moves its pages rather
    than its bytes), once the interpreter has specialised the append (after its first few runs:
    :data:`_WARM` runs it at import). A string that is not ASCII after a payload makes the text
    wider, which copies it once (the payload's pieces are gone by then)."""
    text = ""
    parts.reverse()
    while parts:
        part = parts.pop()
        if isinstance(part, str):
            text += part
            continue
        part.reverse()
        while part:
            piece = part.pop()
            text += piece.decode("ascii")
            del piece
    return text


#: The appends of :func:`grow_text` specialised at import (CPython 3.11 copies the text until
#: the function has run a few times and its appends are specialised), so that the first large
#: payload is not copied either.
_WARM = [grow_text(["A", [bytearray(b"AAAA") for _ in range(16)], "B"]) for _ in range(8)]
