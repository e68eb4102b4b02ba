"""The size of a value's JSON without building it.

:func:`json_size` is ``len(json.dumps(value, ensure_ascii=False).encode())``, exactly, computed
by walking the value: an ASCII string (a base64 payload of megabytes) is measured by one
byte-table pass instead of being escaped, joined and encoded while the GIL is held (about 1 s
for a 240 MB chat history, during which the server's event loop answered nobody), a window of
it at a time (no copy of a payload of megabytes is made whole).
"""

from __future__ import annotations

import json
from typing import Any

#: ASCII bytes JSON writes as they are (everything but control characters, '"' and '\\').
_VERBATIM = bytes(b for b in range(0x20, 0x80) if b not in b'"\\')
#: Bytes written as a two-character escape; other control characters take six (\\u00XX).
_SHORT_ESCAPES = frozenset(b'"\\\b\f\n\r\t')


#: Characters of a long ASCII string measured at a time (its bytes are never made whole).
_WINDOW = 1024 * 1024


def _str_size(text: str) -> int:
    if not text.isascii():
        return len(json.dumps(text, ensure_ascii=False).encode())
    size = len(text) + 2
    for at in range(0, len(text), _WINDOW):
        escaped = text[at:at + _WINDOW].encode("ascii").translate(None, _VERBATIM)
        size += sum(1 if b in _SHORT_ESCAPES else 5 for b in escaped)
    return size


def json_size(value: Any) -> int:
    """Bytes of ``json.dumps(value, ensure_ascii=False)`` in UTF-8 (default separators)."""
    if isinstance(value, str):
        return _str_size(value)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            return len(json.dumps(value, ensure_ascii=False).encode())
        items = sum(_str_size(k) + 2 + json_size(v) for k, v in value.items())  # 'key': value
        return 2 + items + 2 * max(0, len(value) - 1)  # braces, ', ' between items
    if isinstance(value, list | tuple):
        return 2 + sum(json_size(v) for v in value) + 2 * max(0, len(value) - 1)
    return len(json.dumps(value, ensure_ascii=False).encode())  # numbers, bools, None
