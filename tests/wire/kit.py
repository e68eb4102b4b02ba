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
