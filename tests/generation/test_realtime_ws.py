"""The realtime WebSockets over a real server (scripted generation): native's message types,
framing, errors and close codes; a client that leaves aborts its generation; the HTTP routes'
per-connection limits (message size, media policy, generation limits, the API key)."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from typing import Any

import msgpack
import psutil
import pytest
from websockets.exceptions import InvalidStatus

from sglang_omni.engines.synth_media import decode_mp4_frames, encode_png, frame_pixels
from tests.generation.kit import (
    HTTP,
    closed_code,
    error_of,
    metric,
    recv,
    scripted_server,
    wait_for,
    ws,
)
from tests.kit import generation_stops
from tests.server import Server

PNG = encode_png(frame_pixels("cat", 0, 8, 8, 0))
ACTION = {"input": {"task": "pick", "image": {"b64_json": base64.b64encode(PNG).decode()}},
          "parameters": {"domain_name": "droid_lerobot", "raw_action_dim": 8}}


@pytest.fixture(scope="module")
def server():
    with scripted_server("--generation.factory.step_time_s", "0.01", "--model-name", "cosmos3",
                         "--server.max_media_bytes", "4096", "--server.max_body_bytes",
                         "200000", "--server.body_timeout_s", "2") as srv:
        yield srv


# --- realtime actions --------------------------------------------------------------------------
def test_actions_metadata_then_answers_with_timing(server: Server) -> None:
    with ws(server, "/v1/actions/realtime") as conn:
        meta = recv(conn)
        assert meta["object"] == "action.metadata" and meta["model"] == "cosmos3"
        conn.send(msgpack.packb(ACTION))
        first = recv(conn)
        assert first["object"] == "action.generation"
        assert first["data"][0]["action"]["values"][b"shape"] == [16, 8]
        assert set(first["server_timing"]) == {"infer_ms"}
        conn.send(msgpack.packb(ACTION))
        second = recv(conn)
        assert set(second["server_timing"]) == {"infer_ms", "prev_total_ms"}
        assert second["data"][0]["action"]["values"][b"data"] == \
            first["data"][0]["action"]["values"][b"data"]


@pytest.mark.parametrize(("message", "says"), [
    (msgpack.packb({"input": {"task": "t"}, "parameters": {}}), "domain_name or domain_id"),
    (msgpack.packb({**ACTION, "input": {"task": "t", "image": "/etc/passwd"}}), "input.image"),
    (msgpack.packb([1, 2]), "a msgpack map"),
    (b"\xc1", "not valid msgpack"),
    ("text", "binary msgpack"),
])
def test_action_errors_are_native_error_then_1011(server: Server, message: Any,
                                                  says: str) -> None:
    with ws(server, "/v1/actions/realtime") as conn:
        recv(conn)
        conn.send(message)
        error = recv(conn)
        assert says in error["error"] and error["code"] in (400, 500)
        assert "Traceback" not in error["error"]
        assert closed_code(conn) == 1011


def test_an_oversized_message_closes_with_1009(server: Server) -> None:
    with ws(server, "/v1/actions/realtime", max_size=None) as conn:
        recv(conn)
        conn.send(b"\x00" * 300_000)
        assert closed_code(conn) == 1009


def test_leaving_aborts_the_action_in_flight() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as slow:
        request = {**ACTION, "parameters": {**ACTION["parameters"],
                                            "num_inference_steps": 100}}
        with ws(slow, "/v1/actions/realtime") as conn:
            recv(conn)
            conn.send(msgpack.packb(request))
            wait_for(lambda: metric(slow, "submitted") == 1, timeout=10)
        wait_for(lambda: metric(slow, "aborted") == 1, timeout=10)
        # stopped near its start (step 0: the abort reached the stage before its engine began)
        wait_for(lambda: bool(generation_stops(slow.log())))
        [(_, step)] = generation_stops(slow.log())
        assert step < 20, step
        assert metric(slow, "completed") == 0


def test_the_api_key_guards_the_websockets() -> None:
    with scripted_server("--api-key", "k3y") as keyed:
        for path in ("/v1/actions/realtime", "/v1/realtime_video/generate"):
            with pytest.raises(InvalidStatus) as refused:  # refused at the handshake
                with ws(keyed, path) as conn:
                    conn.recv(timeout=10)
            assert refused.value.response.status_code == 403
        with ws(keyed, "/v1/actions/realtime",
                additional_headers={"Authorization": "Bearer k3y"}) as conn:
            assert recv(conn)["object"] == "action.metadata"


# --- realtime video ----------------------------------------------------------------------------
INIT = {"type": "init", "prompt": "sea", "size": "32x32", "num_frames": 3}


def test_invalid_init_is_answered_and_the_server_waits(server: Server) -> None:
    with ws(server, "/v1/realtime_video/generate") as conn:
        for bad, says in ((msgpack.packb({"type": "init"}), "prompt: required"),
                          (msgpack.packb({"prompt": "x"}), "type"),
                          (msgpack.packb({**INIT, "size": "4096x4096"}), "max_pixels"),
                          (msgpack.packb({**INIT, "input_reference": "/etc/passwd"}),
                           "input_reference"),
                          (msgpack.packb({**INIT, "condition_inputs": {"a": 1}}),
                           "condition_inputs"),
                          (msgpack.packb({**INIT, "max_chunks": 0}), "max_chunks")):
            conn.send(bad)
            error = recv(conn)
            assert error["type"] == "error" and error["content"] == "invalid generate request"
            assert says in error["error"]["message"], error
        conn.send(msgpack.packb({**INIT, "max_chunks": 1}))
        assert recv(conn)["type"] == "frame_batch"
        assert closed_code(conn) == 1000


def test_chunks_follow_the_prompt_events(server: Server) -> None:
    with ws(server, "/v1/realtime_video/generate") as conn:
        # chunks of 1.5 s (150 steps of 0.01 s): the events below reach the server while
        # chunk 1 is made, however slowly this client runs (the server makes chunks back to
        # back: with short chunks, all three could be done before the events arrive)
        conn.send(msgpack.packb({**INIT, "max_chunks": 3, "first_frame": PNG,
                                 "num_inference_steps": 150}, use_bin_type=True))
        first = recv(conn)
        conn.send(msgpack.packb({"type": "event", "kind": "prompt", "payload": "storm",
                                 "event_id": 7}))
        conn.send(msgpack.packb({"type": "event", "kind": "camera", "payload": "left"}))
        assert first["type"] == "frame_batch" and first["chunk_index"] == 0
        assert first["content_type"] == "video/mp4" and first["num_frames"] == 3
        assert first["total_size"] == len(first["payload"])
        assert first["is_final_frame_batch"] is True and first["num_frame_batches"] == 1
        assert "event_id" not in first
        frames = decode_mp4_frames(first["payload"])
        assert len(frames) == 3 and frames[0].shape == (32, 32, 3)
        later = [recv(conn) for _ in range(3)]
        errors = [m for m in later if m["type"] == "error"]
        chunks = [m for m in later if m["type"] == "frame_batch"]
        assert [e["content"] for e in errors] == ["invalid event"]
        assert [c["chunk_index"] for c in chunks] == [1, 2]
        assert chunks[-1].get("event_id") == 7
        assert closed_code(conn) == 1000


def test_one_session_at_a_time_and_leaving_aborts() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as slow:
        with ws(slow, "/v1/realtime_video/generate") as conn:
            conn.send(msgpack.packb({**INIT, "num_inference_steps": 100}))
            wait_for(lambda: metric(slow, "submitted") == 1, timeout=10)
            with ws(slow, "/v1/realtime_video/generate") as second:
                error = recv(second)
                assert error == {"type": "error",
                                 "content": "another realtime session is already active"}
                assert closed_code(second) == 1008
        wait_for(lambda: metric(slow, "aborted") == 1, timeout=10)
        with ws(slow, "/v1/realtime_video/generate") as again:  # the slot is free again
            again.send(msgpack.packb({**INIT, "max_chunks": 1, "num_inference_steps": 1}))
            assert recv(again)["type"] == "frame_batch"


def test_a_session_without_init_is_closed_in_time(server: Server) -> None:
    """The body timeout closes a session that sends no init: the error names it."""
    with ws(server, "/v1/realtime_video/generate") as conn:
        error = recv(conn)
        assert "server.body_timeout_s" in error["error"]["message"]
        assert closed_code(conn) == 1008


def test_a_failed_chunk_ends_the_session(server: Server) -> None:
    with ws(server, "/v1/realtime_video/generate") as conn:
        conn.send(msgpack.packb({**INIT, "prompt": "!no-media sea"}))
        error = recv(conn)
        assert error["type"] == "error"
        assert error["content"].startswith("error during generate loop:")
        assert error["error"]["code"] == 500
        assert closed_code(conn) == 1000


def test_a_session_opened_as_the_last_one_ends_waits_for_its_slot() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as slow:
        with ws(slow, "/v1/realtime_video/generate") as conn:
            conn.send(msgpack.packb({**INIT, "prompt": "sea !abort-delay=1",
                                     "num_inference_steps": 100}))
            wait_for(lambda: metric(slow, "submitted") == 1, timeout=10)
        # the first session's chunk takes 1 s to abort; the next session waits for the slot
        with ws(slow, "/v1/realtime_video/generate") as again:
            again.send(msgpack.packb({**INIT, "max_chunks": 1, "num_inference_steps": 1}))
            assert recv(again)["type"] == "frame_batch"
        assert metric(slow, "aborted") == 1


def _silent_session(server: Server) -> socket.socket:
    """A realtime video session whose client never reads (a small receive buffer, big chunks)."""
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /v1/realtime_video/generate HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    assert sock.recv(12) == b"HTTP/1.1 101"
    init = msgpack.packb({**INIT, "prompt": "!size=3000000 sea", "max_chunks": 100})
    sock.sendall(bytes([0x82, 0x80 | 126]) + struct.pack(">H", len(init)) + b"\0\0\0\0" + init)
    return sock


def test_a_client_that_stops_reading_loses_its_session() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.01",
                         "--server.send_timeout_s", "2") as server:
        silent = _silent_session(server)
        try:
            wait_for(lambda: metric(server, "submitted") >= 1, timeout=10)  # chunks are made
            deadline = time.monotonic() + 30
            while True:  # refused (1008) while the silent client holds the slot
                with ws(server, "/v1/realtime_video/generate") as other:
                    other.send(msgpack.packb({**INIT, "max_chunks": 1}))
                    if recv(other)["type"] == "frame_batch":
                        break
                assert time.monotonic() < deadline, "the silent client kept its session"
            assert "read nothing for 2 s (server.send_timeout_s)" in server.log()
            mine = silent.getsockname()[1]  # the server dropped the connection and its buffers
            wait_for(lambda: all(c.raddr.port != mine for c in psutil.Process(
                server.proc.pid).net_connections(kind="tcp") if c.raddr), timeout=10)
        finally:
            silent.close()


def test_an_upgraded_connection_outlives_the_http_deadlines() -> None:
    """Once a connection is a WebSocket, the HTTP protocol's idle, header and body deadlines
    (``serve/protocol/connection.py``, 1 s each here, 2 s more for the body backstop) no longer
    apply: a
    session whose two chunks take about 2.5 s each ends normally, both chunks delivered."""
    with scripted_server("--generation.factory.step_time_s", "0.02", "--server.header_timeout_s",
                         "1", "--server.idle_timeout_s", "1", "--server.body_timeout_s",
                         "1") as server, ws(server, "/v1/realtime_video/generate") as conn:
        conn.send(msgpack.packb({**INIT, "max_chunks": 2, "num_inference_steps": 125}))
        started = time.monotonic()
        chunks = [recv(conn) for _ in range(2)]
        assert [c.get("chunk_index") for c in chunks] == [0, 1], chunks
        assert closed_code(conn) == 1000
        assert time.monotonic() - started > 3  # past every deadline of the HTTP protocol


# --- admission ---------------------------------------------------------------------------------
def refusals(server: Server, reason: str) -> float:
    """``sgl_omni_admission_refusals_total`` for ``reason``."""
    for line in HTTP.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(f'sgl_omni_admission_refusals_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no refusal counter for {reason}")


def test_max_chunks_has_a_server_maximum(server: Server) -> None:
    """``max_chunks`` 2**63 was taken: a session that held the one slot for ever."""
    with ws(server, "/v1/realtime_video/generate") as conn:
        for too_many in (2**63, 101):
            conn.send(msgpack.packb({**INIT, "max_chunks": too_many}))
            error = recv(conn)
            assert error["content"] == "invalid generate request", error
            message = error["error"]["message"]
            assert message.startswith("max_chunks: at most 100 (server.max_realtime_chunks)"), \
                message
        conn.send(msgpack.packb({**INIT, "max_chunks": 1}))  # the session is still usable
        assert recv(conn)["type"] == "frame_batch"
        assert closed_code(conn) == 1000


SLOW_ACTION = {**ACTION, "parameters": {**ACTION["parameters"], "num_inference_steps": 100}}


def test_realtime_requests_take_admission_tickets() -> None:
    """Each realtime action and each realtime video chunk takes a ticket of the direct routes'
    admission for its own generation: over ``server.max_direct_queue`` it is refused as the
    HTTP route refuses (500 sessions of 4 actions used to put 100 generations side by side on
    the stage, 0 refused); a session between its requests holds none."""
    with scripted_server("--generation.factory.step_time_s", "0.25", "--server.max_direct_queue",
                         "1", "--server.max_realtime_chunks", "2") as slow:
        actions = f"{slow.url}/v1/actions/generations"
        with ws(slow, "/v1/actions/realtime") as busy:
            recv(busy)
            busy.send(msgpack.packb(SLOW_ACTION))  # 25 s: holds the only ticket
            wait_for(lambda: metric(slow, "submitted") == 1, timeout=30)
            with ws(slow, "/v1/actions/realtime") as refused:
                recv(refused)
                refused.send(msgpack.packb(ACTION))
                error = recv(refused)
                assert error["code"] == 503 and error["type"] == "service_unavailable", error
                assert "server.max_direct_queue 1" in error["error"], error
                assert closed_code(refused) == 1011
            assert error_of(HTTP.post(actions, json=ACTION))["code"] == 503
            assert refusals(slow, "direct_queue") == 2
        wait_for(lambda: metric(slow, "aborted") == 1, timeout=30)  # its client left
        with ws(slow, "/v1/actions/realtime") as idle:  # answered, then idle: holds no ticket
            recv(idle)
            idle.send(msgpack.packb(ACTION))
            assert recv(idle)["object"] == "action.generation"
            assert HTTP.post(actions, json=ACTION).status_code == 200
        with ws(slow, "/v1/realtime_video/generate") as video:
            video.send(msgpack.packb({**INIT, "num_inference_steps": 100}))
            wait_for(lambda: metric(slow, "submitted") == 4, timeout=30)  # its first chunk
            assert error_of(HTTP.post(actions, json=ACTION))["code"] == 503
        wait_for(lambda: metric(slow, "aborted") == 2, timeout=30)
        with ws(slow, "/v1/realtime_video/generate") as video:  # no max_chunks: the maximum
            video.send(msgpack.packb({**INIT, "num_inference_steps": 1}))
            assert [recv(video)["chunk_index"] for _ in range(2)] == [0, 1]
            assert closed_code(video) == 1000
