"""A text built from pieces sent one at a time, growing in place (the body readers' long strings).

CPython appends to a string that only one frame holds without copying it (a realloc, which for
a large block moves its pages rather than its bytes), once the interpreter has specialised the
append: :data:`_WARM` runs it at import, so that the first long string is not copied either.
"""

from __future__ import annotations

from collections.abc import Generator


def growing_text(text: str) -> Generator[str | None, str | None, None]:
    """Appends each piece sent to ``text`` in place; sent None, yields the text. Prime it with
    ``next()`` first."""
    while True:
        piece = yield None
        if piece is None:
            break
        text += piece
        del piece
    yield text


def _built(pieces: list[str]) -> str | None:
    builder = growing_text("")
    next(builder)
    for piece in pieces:
        builder.send(piece)
    return builder.send(None)


#: The appends of :func:`growing_text` specialised at import (CPython 3.11 copies the text
#: until they have run a few times).
_WARM = [_built(["abcd"] * 16) for _ in range(8)]
