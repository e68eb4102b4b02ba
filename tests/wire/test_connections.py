"""Connection timeouts over raw sockets: idle, slow headers and slow bodies are cut off (the
shared server sets each timeout to 1 s)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.kit import script, wait_for
from tests.server import SCRIPTED_UMM, Server
from tests.wire.kit import connect, read_until_closed

LIMIT_S = 10  # generous: the server's timeouts are 1 s (2 s more for the body backstop)


def test_a_connection_that_sends_nothing_is_closed(limited: Server) -> None:
    with connect(limited.url) as sock:
        data, _ = read_until_closed(sock, LIMIT_S)
    assert data == b""


def test_slow_headers_are_cut_off(limited: Server) -> None:
    with connect(limited.url) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        data, _ = read_until_closed(sock, LIMIT_S)
    assert b"200" not in data


def test_a_slow_body_gets_408_and_the_connection_is_closed(limited: Server) -> None:
    with connect(limited.url) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        data, _ = read_until_closed(sock, LIMIT_S)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == 408


def test_a_body_no_route_reads_is_cut_off_too(limited: Server) -> None:
    with connect(limited.url) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        data, _ = read_until_closed(sock, LIMIT_S)
    assert data.startswith(b"HTTP/1.1 404")


def test_keep_alive_serves_then_closes_when_idle(limited: Server) -> None:
    with connect(limited.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data, _ = read_until_closed(sock, LIMIT_S)
    assert data.startswith(b"HTTP/1.1 200")


def test_an_oversized_or_broken_head_is_400_json(limited: Server) -> None:
    endless = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000  # never ends
    for head in (endless, b"NOT HTTP AT ALL\r\n\r\n"):
        with connect(limited.url) as sock:
            sock.sendall(head)
            data, _ = read_until_closed(sock, LIMIT_S)
        head_out, _, body = data.partition(b"\r\n\r\n")
        assert head_out.startswith(b"HTTP/1.1 400"), data[:200]
        assert json.loads(body)["error"]["code"] == 400


def test_a_whole_head_over_16_kib_is_431_json(limited: Server) -> None:
    """h11 bounds only a head still arriving; one sent whole is measured too."""
    for size, status in ((20_000, b"431"), (15_000, b"200")):
        with connect(limited.url) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
                         + b"a" * size + b"\r\n\r\n")
            data, _ = read_until_closed(sock, LIMIT_S)
        head_out, _, body = data.partition(b"\r\n\r\n")
        assert head_out.startswith(b"HTTP/1.1 " + status), (size, data[:200])
        if status == b"431":
            error = json.loads(body)["error"]
            assert error["code"] == 431 and "over the server's 16384" in error["message"]


@pytest.mark.parametrize(("size", "status"), [(20_000, b"431"), (9_000, b"431"),
                                              (8_000, b"403")])  # 403: no WebSocket route
def test_a_websocket_handshake_with_an_overlong_head_is_answered_and_closed(
        limited: Server, size: int, status: bytes) -> None:
    """The websockets library refuses a header line over 8 KiB with 431 (uvicorn left that
    answer unsent and the connection open for good)."""
    with connect(limited.url) as sock:
        sock.sendall(b"GET /v1/realtime_video/generate HTTP/1.1\r\nHost: x\r\nUpgrade: websocket"
                     b"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
        data, _ = read_until_closed(sock, LIMIT_S)
    assert data.startswith(b"HTTP/1.1 " + status), data[:200]


STALLED_STREAM = script({"action": "image", "prompt": "!size=8000000 big"},
                        {"action": "image", "prompt": "!size=8000000 again"},
                        {"action": "final", "text": "never read"})


def test_a_stream_the_client_stopped_reading_ends_after_send_timeout_s() -> None:
    """A stalled reader held its request (slot, retained media) past its deadline, for as long
    as it stayed connected; now its connection is aborted and the request cancelled."""
    with Server(*SCRIPTED_UMM, "--server.send_timeout_s", "2") as server:
        body = json.dumps({"prompt": STALLED_STREAM, "stream": True,
                           "stage_params": {"generation": {"width": 64, "height": 64}}})
        with connect(server.url) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
            wait_for(lambda: "sgl_omni_active_requests 1.0" in metrics(server), timeout=10)
            wait_for(lambda: "sgl_omni_active_requests 0.0" in metrics(server), timeout=20)
        log = server.log()
        assert "read nothing of its answer for 2 s (server.send_timeout_s)" in log
        assert "status=499" in log


def metrics(server: Server) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=5).text


def request_count(server: Server, route: str) -> float:
    """The requests to ``route`` the server has answered (any status), from /metrics."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(server).splitlines()
               if line.startswith("sgl_omni_requests_total{") and f'route="{route}"' in line)


def test_content_length_with_transfer_encoding_is_400_and_closed(limited: Server) -> None:
    """RFC 9112 section 6.1: h11 read such a request as chunked and kept the connection, so a
    request smuggled behind its body was served (400, then 200)."""
    before = request_count(limited, "/v1/models")
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(limited.url) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                     + smuggled)
        data, _ = read_until_closed(sock, LIMIT_S)  # EOF after one answer
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data[:200]
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == 400
    assert "Content-Length and Transfer-Encoding" in error["message"]
    # the smuggled request never reached a route (the connection was closed before it was read)
    httpx.get(f"{limited.url}/v1/models", timeout=5).raise_for_status()
    assert request_count(limited, "/v1/models") == before + 1
