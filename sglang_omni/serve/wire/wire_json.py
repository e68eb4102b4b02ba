"""JSON of bodies holding megabytes of base64, encoded without holding the GIL for long.

``json.dumps`` scans each string in one C call that holds the GIL: for the base64 of an 8 MiB
video that is tens of milliseconds, during which the event loop waits, although the encoding
runs on a worker thread. A :class:`WireText` is a string known to need no escaping (a base64
``data:`` URL, built by :func:`base64_url` a window at a time); :func:`dumps` and
:func:`dumps_bytes` encode the rest of the body with ``json.dumps`` and copy each long
``WireText`` into place a window at a time, so the loop can take the GIL between windows. The
output is what ``json.dumps`` gives (ASCII JSON).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from typing import Any

#: A WireText shorter than this is left to json.dumps.
SPLICE_MIN = 64 * 1024
#: Characters copied, and raw bytes base64-encoded, at a time (a multiple of 3).
WINDOW = 3 * 128 * 1024


class WireText(str):
    """An ASCII string that holds no character JSON escapes (no quote, backslash or control
    character): base64 and ``data:`` URLs of it."""

    __slots__ = ()


def base64_url(mime_type: str, data: bytes | bytearray | memoryview) -> WireText:
    """``data:MIME;base64,...`` of ``data``, encoded a window at a time."""
    view = memoryview(data).cast("B")
    pieces = [f"data:{mime_type};base64,"]
    pieces += [base64.b64encode(view[at:at + WINDOW]).decode("ascii")
               for at in range(0, len(view), WINDOW)]
    return WireText("".join(pieces))


def _set_aside(value: Any, texts: list[str], nonce: str) -> Any:
    if isinstance(value, WireText):
        if len(value) >= SPLICE_MIN and value.isascii():
            texts.append(value)
            return f"{nonce}-{len(texts) - 1}"
        return value
    if isinstance(value, dict):
        return {k: _set_aside(v, texts, nonce) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_set_aside(v, texts, nonce) for v in value]
    return value


def _pieces(obj: Any) -> tuple[list[str], list[str]]:
    """The skeleton's pieces (between the long texts) and the long texts."""
    texts: list[str] = []
    nonce = secrets.token_hex(12)
    skeleton = json.dumps(_set_aside(obj, texts, nonce))
    if not texts:
        return [skeleton], []
    parts = re.split(f'"{nonce}-(\\d+)"', skeleton)
    return parts[0::2], [texts[int(i)] for i in parts[1::2]]


def dumps(obj: Any) -> str:
    """``json.dumps(obj)``, long WireTexts spliced in."""
    skeleton, texts = _pieces(obj)
    if not texts:
        return skeleton[0]
    out = [skeleton[0]]
    for text, after in zip(texts, skeleton[1:], strict=True):
        out += ['"', text, '"', after]
    return "".join(out)


def dumps_bytes(obj: Any) -> bytes | memoryview:
    """``json.dumps(obj).encode()``: bytes, or a view of them when long WireTexts were copied
    in a window at a time."""
    skeleton, texts = _pieces(obj)
    if not texts:
        return skeleton[0].encode("ascii")
    out = bytearray(sum(map(len, skeleton)) + sum(len(t) + 2 for t in texts))
    at = 0

    def put(piece: bytes) -> None:
        nonlocal at
        out[at:at + len(piece)] = piece
        at += len(piece)

    put(skeleton[0].encode("ascii"))
    for text, after in zip(texts, skeleton[1:], strict=True):
        put(b'"')
        for start in range(0, len(text), WINDOW):
            put(text[start:start + WINDOW].encode("ascii"))
        put(b'"')
        put(after.encode("ascii"))
    return memoryview(out)
