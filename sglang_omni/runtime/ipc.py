"""Framed messages between the server and a stage process.

A message is a msgpack header (a dict: a message of :mod:`sglang_omni.contract.messages`, encoded
by its codec) followed by zero or more raw byte frames, so media travel
as bytes, never re-encoded as text. Each piece goes over a Unix stream socket as an 8-byte length
and its bytes; a frame is received straight into its own buffer (one copy out of the kernel).
Sends are serialized by a lock so that a header and its frames stay together. :class:`Channel`
(blocking, thread-safe sends, one reader thread) is the stage process's end; the server's end is
:class:`~sglang_omni.runtime.stage.link.StageLink`, on the server's event loop, same wire and the
same framing: both send what :func:`pack_message` and :func:`wire_pieces` give and put what
arrives together with :class:`Incoming` (a header that is not one is a ``ProtocolError``).

An ASCII string of at least :data:`MIN_TEXT` characters in a header (a ``data:`` URL of a
request's inline media) is not packed into it: it travels after the frames as a piece of its
own, encoded a window at a time as it is sent, and the receiver puts it back in its place. So
sending a request holds little beyond the request itself, not a packed copy of its header.

A frame may also be base64 text, an :class:`~sglang_omni.media.inline.InlinePayload` (a client's
inline medium, checked strict base64 where it entered): it travels as that text, encoded a
window at a time as it is sent, and the receiver decodes it a window at a time as it arrives,
so its frame is the bytes the text decodes to. The sender never holds those bytes beside the
text, and the receiver never holds the text. The header lists such frames (``b64frames``, their
indices); a frame that is not strict base64 arrives empty and sets ``wire_error`` in the
header (the message is read whole, so the messages behind it stay in step).

A message can take long to arrive whole (an interleaved request's media: hundreds of MiB, sent
as the server's loop gets to it), and the messages behind it wait. ``Channel.recv(keepalive=f)``
calls ``f(moved)`` every :data:`KEEPALIVE_S` while a message is partly received, whether bytes
arrive or not (``moved``: whether some did since the last call), so the stage answers the
server's heartbeat (the ping queued behind the media) meanwhile, and knows the server is alive
while its bytes keep coming.
"""

from __future__ import annotations

import binascii
import enum
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack

from sglang_omni.contract.messages import Message, ProtocolError, encode
from sglang_omni.contract.result import Frames
from sglang_omni.media.inline import InlinePayload

_LEN = struct.Struct("!Q")
_SOCKET_BUFFER = 4 * 1024 * 1024
#: ASCII strings this long travel beside the header (see the module contract).
MIN_TEXT = 1024 * 1024
#: Characters of such a string encoded and sent at a time.
TEXT_WINDOW = 1024 * 1024
#: The msgpack extension type that stands in the header for a string sent beside it.
_TEXT_EXT = 17
#: What a sender may put among a message's frames: bytes, or base64 text the receiver gets
#: decoded (see the module contract).
WireFrame: TypeAlias = bytes | bytearray | InlinePayload
#: ``wire_error`` of a message one of whose base64 frames was not strict base64.
BASE64_ERROR = "a base64 frame of the message is not strict base64"
#: Seconds between ``keepalive`` calls while a message is partly received (well under the
#: server's stall timeout, 3 s by default).
KEEPALIVE_S = 0.5


@dataclass(frozen=True)
class PackedHeader:
    """A header packed by :func:`pack_header`: its msgpack bytes and the strings sent after
    its frames."""

    head: bytes
    texts: list[str]

    @property
    def nbytes(self) -> int:
        """The bytes it takes on the wire (the texts set aside are ASCII)."""
        return len(self.head) + sum(len(text) for text in self.texts)


def frame_size(frame: WireFrame) -> int:
    """The bytes ``frame`` takes on the wire (a base64 frame: its characters)."""
    if isinstance(frame, InlinePayload):
        return len(frame.text) - frame.start
    return len(frame)


def pack_message(header: Message | dict[str, Any], frames: Sequence[WireFrame] = ()
                 ) -> PackedHeader:
    """:func:`pack_header` for a message whose frames are ``frames``, naming the base64 ones
    (``b64frames``) for the receiver."""
    if not isinstance(header, dict):
        header = encode(header)
    b64 = [i for i, frame in enumerate(frames) if isinstance(frame, InlinePayload)]
    return pack_header({**header, "b64frames": b64} if b64 else header, len(frames))


def wire_pieces(packed: PackedHeader, frames: Sequence[WireFrame]) -> Iterator[Any]:
    """The buffers of one message, in wire order (each piece an 8-byte length and its bytes);
    base64 frames and the texts set aside are encoded a window at a time."""
    yield _LEN.pack(len(packed.head))
    yield packed.head
    for frame in frames:
        if isinstance(frame, InlinePayload):
            yield _LEN.pack(frame_size(frame))
            yield from _ascii_windows(frame.text, frame.start)
        else:
            yield _LEN.pack(len(frame))
            yield frame
    for text in packed.texts:  # ASCII: as many bytes as characters
        yield _LEN.pack(len(text))
        yield from _ascii_windows(text, 0)


def _ascii_windows(text: str, start: int) -> Iterator[bytes]:
    for at in range(start, len(text), TEXT_WINDOW):  # a window's copy at a time
        yield text[at:at + TEXT_WINDOW].encode("ascii")


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected sockets: keep one, pass the other to a spawned process."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
    return a, b


class WireEncodeError(ValueError):
    """A message header holds a value msgpack cannot carry; ``path`` names it (``a.b[2]``)."""

    def __init__(self, detail: str, path: str | None) -> None:
        where = f" at {path}" if path else ""
        super().__init__(f"{detail}{where}")
        self.detail = detail
        self.path = path


def pack_header(header: Message | dict[str, Any], nframes: int = 0) -> PackedHeader:
    """The wire form of ``header`` (a typed message is encoded by ``contract.messages``'s
    codec first); WireEncodeError naming the first value it cannot carry
    (an integer outside 64 bits, a string that is not valid Unicode, a type msgpack lacks,
    nesting deeper than msgpack allows)."""
    if not isinstance(header, dict):
        header = encode(header)
    texts: list[str] = []
    try:
        lean = _set_texts_aside(header, texts, 0)
        return PackedHeader(msgpack.packb({**lean, "nframes": nframes, "ntexts": len(texts)}),
                            texts)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError) as exc:
        path = find_unencodable(header)
        raise WireEncodeError(_describe(exc), path) from None


def _set_texts_aside(value: Any, texts: list[str], depth: int) -> Any:
    """``value`` with each long ASCII string replaced by an extension naming its place in
    ``texts`` (containers holding none are kept as they are)."""
    if isinstance(value, str):
        if len(value) >= MIN_TEXT and value.isascii():
            texts.append(value)
            return msgpack.ExtType(_TEXT_EXT, (len(texts) - 1).to_bytes(4, "big"))
        return value
    if depth > 512:  # msgpack refuses it anyway
        return value
    if isinstance(value, dict):
        pairs = {k: _set_texts_aside(v, texts, depth + 1) for k, v in value.items()}
        return pairs if any(pairs[k] is not v for k, v in value.items()) else value
    if isinstance(value, list | tuple):
        items = [_set_texts_aside(v, texts, depth + 1) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def put_texts_back(value: Any, texts: list[str]) -> Any:
    """Undo :func:`_set_texts_aside` on an unpacked header."""
    if isinstance(value, msgpack.ExtType) and value.code == _TEXT_EXT:
        return texts[int.from_bytes(value.data, "big")]
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = put_texts_back(item, texts)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = put_texts_back(item, texts)
    return value


def _describe(exc: Exception) -> str:
    if isinstance(exc, OverflowError):
        return "an integer outside the 64-bit range"
    if isinstance(exc, UnicodeEncodeError):
        return "a string that is not valid Unicode (a lone surrogate)"
    if isinstance(exc, TypeError):
        return f"a value of a type the stage wire cannot carry ({exc})"
    return f"a value the stage wire cannot carry ({exc})"


def find_unencodable(value: Any, path: str = "", depth: int = 0) -> str | None:
    """The path of the first value inside ``value`` that msgpack cannot pack, or None."""
    if depth > 400:
        return path or "(root)"
    if isinstance(value, dict):
        for key, item in value.items():
            if not _packs(key):
                return f"{path}.{key!r}" if path else repr(key)
            found = find_unencodable(item, f"{path}.{key}" if path else str(key), depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = find_unencodable(item, f"{path}[{i}]", depth + 1)
            if found is not None:
                return found
        return None
    return None if _packs(value) else (path or "(root)")


def _packs(value: Any) -> bool:
    try:
        msgpack.packb(value)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError):
        return False
    return True


class PieceKind(enum.Enum):
    """What the next piece of a message is (see the module contract)."""

    FRAME = "frame"
    BASE64 = "base64"
    TEXT = "text"


class Incoming:
    """One message as its pieces arrive: the receiving half of the framing, shared by both
    ends (``Channel.recv`` here, ``StageLink`` on the server's loop), which only move bytes.

    Built from the header piece (ProtocolError when it is not msgpack, not a map, or its
    counts are not counts); :meth:`wants` says what piece comes next (None: the message is
    whole), :meth:`add` takes it, :meth:`finish` gives the header, long texts put back, and
    the frames."""

    __slots__ = ("header", "frames", "texts", "_nframes", "_ntexts", "_b64")

    def __init__(self, piece: bytes | bytearray) -> None:
        try:
            header = msgpack.unpackb(piece)
        except Exception as exc:  # noqa: BLE001 - any unpacking failure is the same fault
            raise ProtocolError(None, "(header)", f"not msgpack ({exc})") from None
        if not isinstance(header, dict):
            raise ProtocolError(None, "(header)",
                                f"expected a map, got {type(header).__name__}")
        self.header: dict[str, Any] = header
        self._nframes = header.pop("nframes", 0)
        self._ntexts = header.pop("ntexts", 0)
        for name, count in (("nframes", self._nframes), ("ntexts", self._ntexts)):
            if type(count) is not int or count < 0:
                raise ProtocolError(_op(header), name, f"expected a count, got {count!r}")
        b64 = header.pop("b64frames", None)
        self._b64: frozenset[int] = _NO_FRAMES
        if b64:  # a message with a client's inline media: rare
            if not isinstance(b64, list) or not all(type(i) is int for i in b64):
                raise ProtocolError(_op(header), "b64frames", "expected a list of integers")
            self._b64 = frozenset(b64)
        self.frames: Frames = []
        self.texts: list[str] = []

    def wants(self) -> PieceKind | None:
        if len(self.frames) < self._nframes:
            return PieceKind.BASE64 if len(self.frames) in self._b64 else PieceKind.FRAME
        if len(self.texts) < self._ntexts:
            return PieceKind.TEXT
        return None

    def add(self, piece: bytearray, decoded: bool = False) -> None:
        """Take the next piece; a base64 frame not ``decoded`` as it arrived is decoded here
        (an empty frame and ``wire_error`` when it is not strict base64)."""
        kind = self.wants()
        if kind is PieceKind.TEXT:
            self.texts.append(piece.decode("ascii"))
        elif kind is PieceKind.BASE64 and not decoded:
            try:
                self.frames.append(bytearray(binascii.a2b_base64(piece, strict_mode=True)))
            except binascii.Error:
                self.header["wire_error"] = BASE64_ERROR
                self.frames.append(bytearray())
        else:
            self.frames.append(piece)

    def finish(self) -> tuple[dict[str, Any], Frames]:
        if self.texts:
            put_texts_back(self.header, self.texts)
        return self.header, self.frames


def _op(header: dict[str, Any]) -> str | None:
    op = header.get("op")
    return op if isinstance(op, str) else None


_NO_FRAMES: frozenset[int] = frozenset()


class Channel:
    """One end of a duplex stage connection. ``send`` is thread-safe; ``recv`` blocks and is
    meant for one reader thread. Both raise EOFError once the peer is gone."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: Message | dict[str, Any],
             frames: Sequence[WireFrame] | None = None) -> None:
        """Pack and send; WireEncodeError (nothing sent) when the header cannot be packed."""
        frames = frames or []
        self.send_packed(pack_message(header, frames), frames)

    def send_packed(self, packed: PackedHeader,
                    frames: Sequence[WireFrame] | None = None) -> None:
        """Send a header packed by ``pack_message(header, frames)`` and its frames."""
        with self._send_lock:
            try:
                for piece in wire_pieces(packed, frames or []):
                    if len(piece):
                        self._sock.sendall(piece)
                    del piece  # a window sent is not held while the next is encoded
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise EOFError(str(exc)) from None

    def recv(self, keepalive: Callable[[bool], None] | None = None
             ) -> tuple[dict[str, Any], Frames]:
        """The next message; ``keepalive`` is called every :data:`KEEPALIVE_S` from its first
        byte until it is whole (from this thread; see the module contract). ProtocolError when
        its header is not a message header (the message is dropped)."""
        (size,) = _LEN.unpack(self._recv_exact(_LEN.size, None))
        alive = _Keepalive(keepalive) if keepalive is not None else None
        incoming = Incoming(self._recv_exact(size, alive))
        while (kind := incoming.wants()) is not None:
            if kind is PieceKind.BASE64:
                incoming.add(self._recv_base64(alive, incoming.header), decoded=True)
            else:
                incoming.add(self._recv_piece(alive))
        return incoming.finish()

    def _recv_piece(self, alive: _Keepalive | None) -> bytearray:
        (size,) = _LEN.unpack(self._recv_exact(_LEN.size, alive))
        return self._recv_exact(size, alive)

    def _recv_base64(self, alive: _Keepalive | None, header: dict[str, Any]) -> bytearray:
        """A base64 frame, decoded a window at a time as it arrives (never held as text); an
        empty frame and ``header["wire_error"]`` when it is not strict base64."""
        (size,) = _LEN.unpack(self._recv_exact(_LEN.size, alive))
        out = bytearray(size // 4 * 3)
        window = bytearray(min(size, TEXT_WINDOW))  # a multiple of 4 characters
        done = 0
        valid = size % 4 == 0
        for at in range(0, size, len(window) or 1):
            view = memoryview(window)[:min(len(window), size - at)]
            self._recv_into(view, alive)
            if not valid:
                continue  # read on, so that the next message starts where it should
            try:
                data = binascii.a2b_base64(view, strict_mode=True)
            except binascii.Error:
                valid = False
                continue
            out[done:done + len(data)] = data
            done += len(data)
            del data  # not held while the next window decodes
        if not valid:
            header["wire_error"] = BASE64_ERROR
            return bytearray()
        del out[done:]  # the padding
        return out

    def _recv_exact(self, size: int, alive: _Keepalive | None) -> bytearray:
        buf = bytearray(size)
        self._recv_into(memoryview(buf), alive)
        return buf

    def _recv_into(self, view: memoryview, alive: _Keepalive | None) -> None:
        size = len(view)
        got = 0
        while got < size:
            if alive is not None:
                alive.wait_readable(self._sock)
            try:
                n = self._sock.recv_into(view[got:], size - got)
            except ConnectionResetError:
                n = 0
            if n == 0:
                raise EOFError("the peer closed the channel")
            got += n
            if alive is not None:
                alive.moved = True

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class _Keepalive:
    """Calls ``callback(moved)`` every :data:`KEEPALIVE_S` while one message is being
    received."""

    def __init__(self, callback: Callable[[bool], None]) -> None:
        self.callback = callback
        self.last = time.monotonic()
        #: Bytes arrived since the last call.
        self.moved = False
        self._poll = select.poll()
        self._registered = False

    def wait_readable(self, sock: socket.socket) -> None:
        """Return once ``sock`` has bytes (or an end) to read, calling back when due."""
        if not self._registered:
            self._poll.register(sock.fileno(), select.POLLIN)
            self._registered = True
        while True:
            self._due()
            if self._poll.poll(KEEPALIVE_S * 1000):
                self._due()
                return

    def _due(self) -> None:
        now = time.monotonic()
        if now - self.last >= KEEPALIVE_S:
            self.last = now
            moved, self.moved = self.moved, False
            self.callback(moved)
