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
* the peak is the body plus one payload: a run is gathered in a growing buffer that the chunks
  leave at once, and made text (off the event loop, in :meth:`RunSplitter.restore`) one payload
  at a time, each buffer dropped as its text is made.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

#: Payloads shorter than this stay in the JSON text.
MIN_RUN = 1024 * 1024
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
        #: The payloads set aside, as their bytes until :meth:`restore` makes them text (off
        #: the event loop: the caller parses in a thread).
        self.runs: list[bytearray | str] = []
        self._token = secrets.token_hex(8)
        self._run: bytearray | None = None  # the payload being gathered
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
            self._run += view[:stop]
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
            self._run = bytearray(self.text[start:])
            del self.text[start:]
            self._tail = 0

    def finish(self) -> None:
        """The body has ended (a run still open ends with it)."""
        if self._run is not None:
            self._end_run()

    def _end_run(self) -> None:
        run, self._run = self._run, None
        assert run is not None
        self._eligible = None
        if len(run) < MIN_RUN:
            self.text += run
            self._tail = len(run)
            self._eligible = False  # this run stays; what follows ends it
            return
        marker = self.marker(len(self.runs)).encode()
        self.runs.append(run)
        self.text += marker
        self._tail = 0
        self._shifts.append((len(self.text), len(run) - len(marker)))

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

        def take(index: int) -> str:
            """Payload ``index`` as text; its bytes are dropped as it is made."""
            run, self.runs[index] = self.runs[index], ""
            return run if isinstance(run, str) else run.decode("ascii")

        def put_back(text: str) -> str:
            if prefix not in text:
                return text
            whole = found.fullmatch(text)
            if whole is not None and int(whole.group(1)) < len(self.runs):
                return take(int(whole.group(1)))  # the payload itself, not a copy of it
            out = text
            for match in found.finditer(text):
                index = int(match.group(1))
                if index < len(self.runs):
                    out = out.replace(match.group(0), take(index), 1)
            return out

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
