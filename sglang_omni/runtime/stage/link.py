"""The server's end of a stage channel, run on the event loop: no threads, no hand-offs.

The wire is :mod:`sglang_omni.runtime.ipc`'s (a msgpack header, its raw frames, then the long
texts set aside; each piece an 8-byte length and its bytes), and so is its framing: messages are
packed by ``ipc.pack_message`` and ``ipc.wire_pieces`` and put together by ``ipc.Incoming``, as
the stage process's ``ipc.Channel`` does; this module only moves the bytes on the loop.

Receiving: the loop's selector says when the socket is readable. Small pieces are parsed out of
one staging buffer; a piece larger than it is received straight into its own buffer (one copy
out of the kernel, as ``Channel.recv``). Each complete message goes to ``on_message(header,
frames)`` on the loop, in order. At most :data:`READ_BUDGET` bytes are read per callback, so a
flood of results cannot hold the loop; an end of file or a socket error calls ``on_lost`` once.
While a message is still arriving (a large result: the stage's heartbeat answers wait behind
it), ``on_bytes()`` is called after each read of its bytes: the stage is alive.

Sending: :meth:`StageLink.send` queues a header packed by ``ipc.pack_message`` and its frames and
writes at once what the socket takes (scatter-gather ``sendmsg``: the frames are not copied); the
rest goes out as the socket drains, in order, at most :data:`WRITE_BUDGET` bytes per callback.
A long text set aside, or a base64 frame, is encoded one window at a time as it goes (only the
server sends base64 frames: the stage's ``Channel`` decodes them as they arrive). A message is
never cut: once queued it is sent whole or the link is lost, and then ``on_error`` of every
message not sent whole is called with EOFError (on the loop, never from inside ``send``). A
failed write (the stage is gone) fails every later send too, while what the stage sent before
it is still read until the end of file.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sglang_omni.contract.messages import ProtocolError
from sglang_omni.contract.result import Frames
from sglang_omni.runtime.ipc import Incoming, PackedHeader, WireFrame, wire_pieces

log = logging.getLogger("sglang_omni.runtime")

_LEN = struct.Struct("!Q")
#: The staging buffer small pieces are received into; a larger piece gets a buffer of its own.
STAGING = 256 * 1024
#: Bytes read, and written, per loop callback at most (the rest waits for the next).
READ_BUDGET = 8 * 1024 * 1024
WRITE_BUDGET = 8 * 1024 * 1024
#: Buffers, and bytes, handed to one ``sendmsg`` at most.
_IOV_MAX = 64
_IOV_BYTES = 4 * 1024 * 1024

MessageCallback = Callable[[dict[str, Any], Frames], None]
ErrorCallback = Callable[[BaseException], None]


class _Outgoing:
    """One queued message: the buffers ready to go and the generator of the rest."""

    __slots__ = ("bufs", "more", "on_error")

    def __init__(self, more: Iterator[Any], on_error: ErrorCallback | None) -> None:
        self.bufs: deque[memoryview] = deque()
        self.more: Iterator[Any] | None = more
        self.on_error = on_error


class StageLink:
    """One connected stage socket, served by the running loop (see the module contract)."""

    def __init__(self, sock: socket.socket, on_message: MessageCallback,
                 on_lost: Callable[[], None], name: str = "stage",
                 on_bytes: Callable[[], None] | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_bytes = on_bytes
        self._name = name
        self.closed = False
        # receiving: [start, end) of the staging buffer holds bytes not parsed yet
        self._staging = bytearray(STAGING)
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None  # a piece too large for staging, being received
        self._big_got = 0
        self._incoming: Incoming | None = None  # the message being received
        # sending
        self._queue: deque[_Outgoing] = deque()
        self._writer_on = False
        self._write_broken = False
        self._loop.add_reader(self._fd, self._on_readable)

    # --- sending ------------------------------------------------------------------------------
    def send(self, packed: PackedHeader, frames: Sequence[WireFrame] | None = None,
             on_error: ErrorCallback | None = None) -> None:
        """Queue a message and write what the socket takes now; ``on_error`` is called (later,
        on the loop) if the link is lost before all of it was written."""
        entry = _Outgoing(wire_pieces(packed, frames or []), on_error)
        if self.closed or self._write_broken:
            self._fail_later([entry])
            return
        self._queue.append(entry)
        if not self._writer_on:
            self._flush()

    @property
    def queued(self) -> int:
        """Messages not yet written whole."""
        return len(self._queue)

    def _flush(self) -> None:
        budget = WRITE_BUDGET
        while self._queue and budget > 0 and not self.closed:
            entry = self._queue[0]
            bufs = entry.bufs
            size = sum(b.nbytes for b in bufs)
            while entry.more is not None and len(bufs) < _IOV_MAX and size < _IOV_BYTES:
                piece = next(entry.more, None)
                if piece is None:
                    entry.more = None
                    break
                view = memoryview(piece).cast("B")
                if view.nbytes:
                    bufs.append(view)
                    size += view.nbytes
            if not bufs:
                self._queue.popleft()  # written whole
                continue
            try:
                sent = self._sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:  # the stage is gone: what it sent before is still read
                self._broken(exc)
                return
            budget -= sent
            left = sent
            while left and bufs:
                head = bufs[0]
                if head.nbytes <= left:
                    left -= head.nbytes
                    bufs.popleft()
                else:
                    bufs[0] = head[left:]
                    left = 0
            if sent < size:  # the socket is full: go on when it drains
                break
        want = bool(self._queue) and not self.closed
        if want and not self._writer_on:
            self._loop.add_writer(self._fd, self._flush)
        elif not want and self._writer_on:
            self._loop.remove_writer(self._fd)
        self._writer_on = want

    # --- receiving ----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            self._read_some()
        finally:
            if self._on_bytes is not None and self._receiving and not self.closed:
                self._on_bytes()  # a message still arriving: the stage is alive

    @property
    def _receiving(self) -> bool:
        """Whether part of a message arrived and the rest has not."""
        return self._big is not None or self._incoming is not None or self._end > self._start

    def drain(self) -> None:
        """Read and hand on every message already in the socket, now (the stage exited: what
        it sent before its exit is handled before the exit is)."""
        while self._read_some():
            pass

    def _read_some(self) -> bool:
        """Read at most :data:`READ_BUDGET` bytes; True when it stopped at that budget (more
        may be waiting)."""
        budget = READ_BUDGET
        while budget > 0 and not self.closed:
            if self._big is not None:
                view = memoryview(self._big)[self._big_got:]
            else:
                if self._end == len(self._staging):
                    self._compact()
                view = memoryview(self._staging)[self._end:]
            try:
                n = self._sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                self._lose(exc)
                return False
            finally:
                view.release()
            if n == 0:
                self._lose(EOFError("the stage closed the channel"))
                return False
            budget -= n
            if self._big is not None:
                self._big_got += n
                if self._big_got == len(self._big):
                    piece, self._big = self._big, None
                    self._piece(piece)
            else:
                self._end += n
                self._parse()
        return budget <= 0 and not self.closed

    def _compact(self) -> None:
        if self._start:
            self._staging[:self._end - self._start] = self._staging[self._start:self._end]
            self._end -= self._start
            self._start = 0

    def _parse(self) -> None:
        buf = self._staging
        while not self.closed:
            avail = self._end - self._start
            if avail < _LEN.size:
                break
            (size,) = _LEN.unpack_from(buf, self._start)
            at = self._start + _LEN.size
            if size <= avail - _LEN.size:
                self._start = at + size
                self._piece(buf[at:at + size])
                continue
            if _LEN.size + size > len(buf):  # too large for staging: a buffer of its own
                big = bytearray(size)
                have = self._end - at
                big[:have] = buf[at:self._end]
                self._big, self._big_got = big, have
                self._start = self._end = 0
                return
            break
        if self._start == self._end:
            self._start = self._end = 0
        elif self._start > len(buf) // 2:
            self._compact()

    def _piece(self, piece: bytearray) -> None:
        if self._incoming is None:
            try:
                self._incoming = Incoming(piece)
            except ProtocolError as exc:  # a garbled header is dropped, not fatal
                log.error("%s: undecodable message from the stage: %s", self._name, exc)
                return
        else:
            self._incoming.add(piece)
        if self._incoming.wants() is not None:
            return
        header, frames = self._incoming.finish()
        self._incoming = None
        try:
            self._on_message(header, frames)
        except Exception:  # noqa: BLE001 - a handler's bug must not stop the link
            log.exception("%s: handling a stage message failed", self._name)

    # --- the end ------------------------------------------------------------------------------
    def _broken(self, exc: BaseException) -> None:
        """Writing failed: fail what is queued, and every later send; reading goes on."""
        log.debug("%s: cannot write to the stage: %r", self._name, exc)
        self._write_broken = True
        if self._writer_on:
            self._loop.remove_writer(self._fd)
            self._writer_on = False
        failed = list(self._queue)
        self._queue.clear()
        self._fail_later(failed)

    def _lose(self, exc: BaseException) -> None:
        if self.closed:
            return
        log.debug("%s: stage channel lost: %r", self._name, exc)
        self._close()
        try:
            self._on_lost()
        except Exception:  # noqa: BLE001
            log.exception("%s: the channel-lost callback failed", self._name)

    def close(self) -> None:
        """Stop serving the socket and close it; queued messages fail with EOFError."""
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._writer_on:
            self._loop.remove_writer(self._fd)
            self._writer_on = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        failed = list(self._queue)
        self._queue.clear()
        self._fail_later(failed)

    def _fail_later(self, entries: list[_Outgoing]) -> None:
        for entry in entries:
            if entry.on_error is not None:
                self._loop.call_soon(entry.on_error, EOFError("the stage channel is closed"))
