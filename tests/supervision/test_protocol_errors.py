"""A stage message that fails to decode is a protocol error naming its field, on both ends of
the wire, and the request it names ends with one well-formed error answer; the stage serves on.

Server end: a real scripted Reasoner stage behind a relay that corrupts the stage's answer on
its way to the server's ``StageHandle``. Stage end: a real stage process whose channel the test
holds, sent hand-built bad frames."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from sglang_omni.errors import ServerError
from sglang_omni.runtime.ipc import Channel, channel_pair, pack_header
from sglang_omni.runtime.stage.child import StageChild
from tests.supervision.test_heartbeat_media import RawStage, next_of
from tests.supervision.test_wire_values import QUICK_S, chat, reasoner

Corrupt = Callable[[dict[str, Any]], dict[str, Any] | None]


def _pump_raw(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 20):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        dst.close()


def _pump_messages(src: Channel, dst: Channel, corrupt: Corrupt) -> None:
    try:
        while True:
            header, frames = src.recv()
            dst.send(corrupt(header) or header, frames)
    except (EOFError, OSError):
        dst.close()


def relayed(monkeypatch: pytest.MonkeyPatch, corrupt: Corrupt) -> None:
    """Every stage spawned from now on talks to its handle through a relay that passes the
    server's messages on as they are and each of the stage's through ``corrupt``."""
    spawn = StageChild.spawn

    def spawn_relayed(self: StageChild) -> socket.socket:
        stage_side = spawn(self)
        handle_side, relay_side = channel_pair()
        threading.Thread(target=_pump_raw, args=(relay_side.dup(), stage_side.dup()),
                         daemon=True).start()
        threading.Thread(target=_pump_messages, args=(Channel(stage_side), Channel(relay_side),
                                                      corrupt), daemon=True).start()
        return handle_side

    monkeypatch.setattr(StageChild, "spawn", spawn_relayed)


def corrupt_first(op: str, field: str, value: Any) -> Corrupt:
    done = [False]

    def corrupt(header: dict[str, Any]) -> dict[str, Any] | None:
        if header.get("op") == op and not done[0]:
            done[0] = True
            return {**header, field: value}
        return None

    return corrupt


@pytest.mark.parametrize(("op", "field", "value", "stream"), [
    ("result", "payload", ["not", "a", "map"], False),
    ("result", "engine_s", "fast", False),
    ("chunk", "data", 42, True),
])
def test_a_corrupt_answer_from_the_stage_fails_its_request_once(
        monkeypatch: pytest.MonkeyPatch, op: str, field: str, value: Any, stream: bool) -> None:
    relayed(monkeypatch, corrupt_first(op, field, value))

    async def main() -> None:
        handle = reasoner()
        await handle.start()
        try:
            with pytest.raises(ServerError) as caught:
                await asyncio.wait_for(handle.call("r1", chat("hello", stream=stream),
                                                   on_chunk=lambda _: None), QUICK_S)
            error = caught.value
            assert f"stage protocol error: {op}.{field}: expected" in error.message
            assert error.to_body()["error"]["code"] == 500
            assert error.to_body()["error"]["type"] == "server_error"
            assert handle.counters.failed == 1 and handle.counters.completed == 0
            assert not handle.calls.pending
            # the stage serves on; the next answer is not corrupted
            result = await asyncio.wait_for(handle.call("r2", chat("again")), QUICK_S)
            assert "again" in result.payload["text"]
            assert handle.healthy
        finally:
            await handle.stop()

    asyncio.run(main())


def send_raw(stage: RawStage, header: Any) -> None:
    """A hand-built header with no frames, packed as it is (the codec is bypassed)."""
    head = msgpack.packb(header)
    stage.sock.sendall(struct.pack("!Q", len(head)) + head)


@pytest.mark.server
def test_the_stage_answers_a_bad_submit_with_an_error_naming_the_field() -> None:
    stage = RawStage()
    try:
        send_raw(stage, {"op": "submit", "rid": "r1", "token": 5, "payload": "text",
                         "nframes": 0, "ntexts": 0})
        error = next_of(stage.inbox, "error")
        assert (error["rid"], error["token"], error["status"]) == ("r1", 5, 500)
        assert "stage protocol error: submit.payload: expected a map, got str" \
            in error["message"]
        # garbage it cannot attribute is logged and dropped: no header, an unknown type, a
        # message only a stage sends
        send_raw(stage, ["not", "a", "header"])
        send_raw(stage, {"op": "launch", "nframes": 0, "ntexts": 0})
        send_raw(stage, {"op": "result", "rid": "r1", "token": 5, "payload": {},
                         "nframes": 0, "ntexts": 0})
        # and it serves on, in step
        stage.channel.send({"op": "ping", "seq": 9})
        assert next_of(stage.inbox, "pong")["seq"] == 9
        stage.channel.send_packed(pack_header(_hello(), 0), [])
        result = next_of(stage.inbox, "result")
        assert result["rid"] == "r2" and "hello" in result["payload"]["text"]
    finally:
        stage.close()


def _hello() -> dict[str, Any]:
    return {"op": "submit", "rid": "r2", "token": 6, "payload": chat("hello")}
