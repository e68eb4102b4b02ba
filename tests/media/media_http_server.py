"""Real HTTP servers on loopback posing as several media hosts, for the media policy tests.

``media_server`` runs the same handler on ``127.0.0.1:P`` and ``127.0.0.2:P``; together with
``localhost`` (which resolves to 127.0.0.1) that gives three distinct host names to allowlist.
Every request is logged (host header, path) so tests can assert that nothing was fetched.
"""

from __future__ import annotations

import functools
import gzip
import io
import random
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from PIL import Image

HOSTS = ("localhost", "127.0.0.1", "127.0.0.2")


def _png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


PNG = _png_bytes()
#: Just over native's default media_url_max_file_size_mb (64 MiB).
BIG = 64 * 1024 * 1024 + 65536


@functools.cache
def mp4_bytes() -> bytes:
    """A real 3-frame H.264 MP4 of 16x16 pixels."""
    import numpy as np

    from sglang_omni.media.encode import encode_mp4

    return encode_mp4([np.full((16, 16, 3), 40 * i, np.uint8) for i in range(3)], 3)


def bad_media() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, what they claim to be): bytes that are not what they claim. A PNG's
    header (signature and IHDR) followed by garbage passes a check of the leading bytes."""
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(4096))
    return {"png-then-garbage": (PNG[:33] + garbage, "image/png"),
            "random": (garbage, "image/png"),
            "gzip": (gzip.compress(PNG, mtime=0), "image/png"),
            "truncated-mp4": (mp4_bytes()[:len(mp4_bytes()) // 2], "video/mp4"),
            "mp4-head-then-garbage": (mp4_bytes()[:32] + garbage, "video/mp4"),
            "not-video": (garbage, "video/mp4")}


@functools.cache
def gzip_bomb() -> bytes:
    """A gzip body of about 70 KiB that unpacks to 72 MiB: a PNG followed by zeros."""
    return gzip.compress(PNG + bytes(72 * 1024 * 1024), compresslevel=9, mtime=0)


@dataclass
class ServerState:
    """What the test servers saw and did; shared by both listeners."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    endless_sent: int = 0
    endless_done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: How each slow answer (stall, trickle, slowloris) ended, by path: ``"hung up"`` when the
    #: client closed the connection before the host was done, else ``"finished"``. A fetch cut
    #: off by its own timeout or deadline shows here as a hang-up, with no clock in the test.
    ended: dict[str, str] = field(default_factory=dict)

    def paths(self) -> list[str]:
        with self.lock:
            return [p for _, p in self.requests]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.endless_sent = 0
            self.endless_done.clear()
            self.ended.clear()

    def end(self, path: str, how: str) -> None:
        with self.lock:
            self.ended[path] = how


class Handler(BaseHTTPRequestHandler):
    state: ServerState  # set on the subclass per fixture

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: C901 - one route table
        state = self.state
        with state.lock:
            state.requests.append((self.headers.get("Host", ""), self.path))
        parts = urlsplit(self.path)
        route, query = parts.path, parse_qs(parts.query)
        if route in ("/ok.png", "/ok", "/secret"):
            self._send(200, PNG, {"Content-Type": "image/png"})
        elif route == "/redirect":
            self._send(int(query.get("code", ["302"])[0]), headers={"Location": query["to"][0]})
        elif route == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif route.startswith("/chain/"):
            n = int(route.rsplit("/", 1)[1])
            target = "/ok.png" if n == 0 else f"/chain/{n - 1}"
            self._send(301, headers={"Location": target})
        elif route == "/missing":
            self._send(404, b"not here")
        elif route == "/error":
            self._send(500, b"boom")
        elif route == "/unavailable":
            self._send(503, b"later")
        elif route == "/stall-headers":
            self._hold(5)
        elif route == "/stall-body":
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"\0" * 100)
            self.wfile.flush()
            self._hold(5)
        elif route == "/trickle":
            self.send_response(200)
            self.end_headers()
            deadline = time.monotonic() + 5
            try:
                while not state.stop.is_set() and time.monotonic() < deadline:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                state.end(self.path, "hung up")
            else:
                state.end(self.path, "finished")
        elif route == "/slowloris":
            self._slowloris()
        elif route == "/endless":
            self._endless()
        elif route == "/big-declared":
            self._send(200, b"x" * 10, {"Content-Length": str(10**9)})
        elif route == "/gzip":
            self._send(200, b"\x1f\x8b" + b"\0" * 20, {"Content-Encoding": "gzip"})
        elif route == "/gzip-bomb":  # about 70 KiB on the wire, 72 MiB once unpacked
            headers = {"Content-Type": "image/png", "Content-Encoding": "gzip"}
            if "unsized" in query:
                self._unsized(gzip_bomb(), headers)
            else:
                self._send(200, gzip_bomb(), headers)
        elif route == "/ok.mp4":
            self._send(200, mp4_bytes(), {"Content-Type": "video/mp4"})
        elif route.startswith("/bad/") and route[5:] in bad_media():
            data, claimed = bad_media()[route[5:]]
            self._send(200, data, {"Content-Type": claimed})
        elif route == "/big-unsized":  # over 64 MiB, without Content-Length
            self._unsized(PNG + bytes(BIG - len(PNG)), {"Content-Type": "image/png"})
        else:
            self._send(404)

    def _hold(self, seconds: float) -> None:
        """Send nothing more for up to ``seconds``, or until the client hangs up (recorded in
        :attr:`ServerState.ended`)."""
        deadline = time.monotonic() + seconds
        while not self.state.stop.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable:
                try:
                    gone = self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone:
                    self.state.end(self.path, "hung up")
                    return
                time.sleep(0.05)  # a client that sent more: not a hang-up
        self.state.end(self.path, "finished")

    def _unsized(self, body: bytes, headers: dict[str, str]) -> None:
        """``body`` with no Content-Length (read until the connection closes), 64 KiB at a time
        until the client hangs up."""
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            for at in range(0, len(body), 65536):
                self.wfile.write(body[at:at + 65536])
        except OSError:
            pass

    def _slowloris(self) -> None:
        """A valid response sent one byte every 0.2 s for up to 30 s: no read ever stalls long
        enough for a per-read timeout, only a deadline on the whole fetch ends it."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        deadline = time.monotonic() + 30
        try:
            for byte in PNG:
                if self.state.stop.is_set() or time.monotonic() > deadline:
                    break
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            self.state.end(self.path, "hung up")
        else:
            self.state.end(self.path, "finished")

    def _endless(self) -> None:
        state = self.state
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        chunk = b"z" * 1024
        try:
            while not state.stop.is_set():
                self.wfile.write(chunk)
                with state.lock:
                    state.endless_sent += len(chunk)
                if state.endless_sent > 256 * 1024 * 1024:  # safety net: never truly endless
                    break
        except OSError:
            pass
        finally:
            state.endless_done.set()


@dataclass
class MediaServer:
    """The running test servers: ``url(host, path)`` builds a URL for one of :data:`HOSTS`."""

    port: int
    state: ServerState

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"


def bind_pair(handler: type[Handler]) -> list[ThreadingHTTPServer]:
    for _ in range(20):
        first = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        try:
            second = ThreadingHTTPServer(("127.0.0.2", first.server_address[1]), handler)
        except OSError:
            first.server_close()
            continue
        return [first, second]
    raise RuntimeError("could not bind the same port on 127.0.0.1 and 127.0.0.2")


@contextmanager
def serving() -> Iterator[MediaServer]:
    """The media hosts on 127.0.0.1 and 127.0.0.2 (one port), serving until the block ends."""
    state = ServerState()
    gzip_bomb()  # made once per process before any fetch (its compression takes a while)
    servers = bind_pair(type("Handler", (Handler,), {"state": state}))
    for srv in servers:
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
    try:
        yield MediaServer(port=servers[0].server_address[1], state=state)
    finally:
        state.stop.set()
        for srv in servers:
            srv.shutdown()
            srv.server_close()
