"""Helpers for the wire tests: raw JSON posts, error bodies, raw sockets."""

from __future__ import annotations

import socket
import time

import httpx

from tests.kit import error_of as error_of  # shared; re-exported for the wire tests

# No keep-alive: the test servers close idle connections after a second.
HTTP = httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))
JSON = {"content-type": "application/json"}
HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def post_raw(url: str, body: bytes, headers: dict[str, str] | None = None,
             timeout: float = 10) -> httpx.Response:
    """POST ``body`` as given (so it may hold what json.dumps would not write)."""
    return HTTP.post(url, content=body, headers={**JSON, **(headers or {})}, timeout=timeout)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took;
    raises TimeoutError when the connection is still open after ``limit_s``."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return data, time.monotonic() - start
        data += chunk


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def refused_prompt(size: int) -> bytes:
    """A body of ``size`` bytes the route refuses with 400 once parsed (prompt not a string)."""
    head, tail = b'{"prompt": 1', b"}"
    return head + b" " * (size - len(head) - len(tail)) + tail


def hold_upload(url: str, size: int) -> socket.socket:
    """A client that declared a ``size``-byte body and sent only its first bytes."""
    sock = connect(url)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(size).encode() + b"\r\n\r\n" + b'{"prompt": ')
    return sock


def answered(sock: socket.socket) -> bool:
    """Whether the server has sent something on ``sock`` (without reading it)."""
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def refused_beside_upload(url: str, held_size: int, body: bytes, limit_s: float = 20.0
                          ) -> tuple[socket.socket, httpx.Response]:
    """Hold an upload of ``held_size`` bytes and POST ``body`` until it is refused (503)
    beside it: (the held upload, the last answer). The held upload takes its share when the
    server starts reading it; one refused because a probe held the budget then is begun
    again."""
    deadline = time.monotonic() + limit_s
    held = hold_upload(url, held_size)
    while True:
        time.sleep(0.2)
        resp = post_raw(f"{url}/generate", body)
        if resp.status_code == 503 or time.monotonic() > deadline:
            return held, resp
        if answered(held):
            held.close()
            held = hold_upload(url, held_size)


def status_within(url: str, body: bytes, want: int, limit_s: float = 10.0) -> httpx.Response:
    """POST ``body`` until it is answered ``want``; the last answer."""
    deadline = time.monotonic() + limit_s
    while True:
        resp = post_raw(f"{url}/generate", body)
        if resp.status_code == want or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)
