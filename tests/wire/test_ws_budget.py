"""WebSocket messages are under the server-wide body budget (``server.max_pending_body_bytes``)
as request bodies are: the bytes a connection buffers before the app takes them (a frame being
received, a message waiting) and the realtime action requests a session holds (the one being
answered and those sent ahead) count beside the bodies being read. A connection whose bytes do not
fit is closed (1013, or the route's error then 1011) and gives its share back, so many clients
sending the largest messages cannot make the server hold gigabytes."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from collections.abc import Iterator

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.kit import wait_until
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_GENERATION, Server
from tests.wire.kit import connect, post_raw, refused_prompt

BUDGET = 3_000_000
FLAGS = ["--server.max_body_bytes", "2000000", "--server.max_pending_body_bytes", str(BUDGET),
         "--server.body_timeout_s", "20", "--generation.factory.step_time_s", "0.01"]
IMAGES = "/v1/images/generations"
ACTIONS = "/v1/actions/realtime"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*SCRIPTED_GENERATION, *FLAGS) as srv:
        yield srv


def pending(server: Server) -> float:
    return Scrape(server).value("sgl_omni_pending_body_bytes")


def raw_ws(server: Server, path: str) -> socket.socket:
    """A WebSocket opened by hand (so a frame can be sent in part), its first message read."""
    sock = connect(server.url)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock


def frame_head(length: int) -> bytes:
    """A final binary frame of ``length`` bytes from a client, masked with a zero key (so the
    payload goes as it is)."""
    return bytes([0x82, 0x80 | 127]) + struct.pack(">Q", length) + b"\0\0\0\0"


def test_a_frame_being_received_counts_beside_request_bodies(server: Server) -> None:
    sock = raw_ws(server, ACTIONS)
    try:
        sock.sendall(frame_head(1_900_000) + b"\0" * 1_800_000)  # held short of its end
        assert wait_until(lambda: pending(server) >= 1_800_000, 10), pending(server)
        refused = post_raw(f"{server.url}{IMAGES}", refused_prompt(1_500_000))
        assert refused.status_code == 503, refused.text
        assert "server.max_pending_body_bytes" in refused.json()["error"]["message"]
        assert post_raw(f"{server.url}{IMAGES}", refused_prompt(1_000)).status_code == 400
        # Another connection's message that does not fit beside it is refused: 1013.
        with ws_connect(server.url.replace("http", "ws") + ACTIONS, open_timeout=10,
                        max_size=None) as other:
            other.recv(timeout=10)  # the metadata
            with pytest.raises(ConnectionClosed) as closed:
                other.send(b"\0" * 1_500_000)
                other.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert "max_pending_body_bytes" in closed.value.rcvd.reason
    finally:
        sock.close()  # the client leaves mid-frame: its share is given back
    assert wait_until(lambda: pending(server) == 0, 10), pending(server)
    assert post_raw(f"{server.url}{IMAGES}", refused_prompt(1_000_000)).status_code == 400


def submitted(server: Server) -> float:
    return Scrape(server).value("sgl_omni_stage_jobs_total", stage="generation",
                                outcome="submitted")


def test_action_requests_sent_ahead_count_while_they_wait(server: Server) -> None:
    upload = connect(server.url)  # a request body of 1.5 MB being read
    upload.sendall(f"POST {IMAGES} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                   "Content-Length: 1500000\r\n\r\n".encode() + b'{"prompt": ')
    try:
        assert wait_until(lambda: pending(server) >= 1_500_000, 10), pending(server)
        with ws_connect(server.url.replace("http", "ws") + ACTIONS, open_timeout=10,
                        max_size=None) as conn:
            conn.recv(timeout=10)  # the metadata
            slow = {"input": {"task": "!sleep=20 hold"},
                    "parameters": {"domain_name": "droid_lerobot"}}
            jobs = submitted(server)
            conn.send(msgpack.packb(slow))
            # the generation runs; the next requests wait in the session
            assert wait_until(lambda: submitted(server) > jobs, 10)
            ahead = msgpack.packb({"pad": b"\0" * 900_000})
            with pytest.raises(ConnectionClosed) as closed:
                for _ in range(3):  # 1.5 MB + 0.9 MB fits; 1.5 MB + 1.8 MB does not
                    conn.send(ahead)
                    time.sleep(0.5)
                while True:
                    answer = msgpack.unpackb(conn.recv(timeout=10), raw=False)
                    assert answer.get("code") == 503, answer
                    assert "max_pending_body_bytes" in answer["error"], answer
        assert closed.value.rcvd is not None and closed.value.rcvd.code in (1011, 1013)
    finally:
        upload.close()
    assert wait_until(lambda: pending(server) == 0, 10), pending(server)
    assert post_raw(f"{server.url}{IMAGES}", refused_prompt(1_000_000)).status_code == 400
