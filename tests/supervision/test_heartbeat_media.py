"""A stage answers the server's heartbeat while a request's media are arriving.

The server's ping waits in the channel behind a message still being received (an interleaved
request's media: hundreds of MiB, written as the server's loop gets to it), so a stage that
answered only the ping itself looked frozen for as long as the media took to arrive, and was
killed as stalled. Here a real scripted Reasoner stage process gets a submit whose 64 MiB media
frame stops half way: the test plays the server's end of the channel and waits for the stage's
heartbeat answers while the frame is incomplete (before the fix none came until it was whole),
then sends the rest and gets the job's result.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import struct
import tempfile
import threading
from typing import Any

import pytest

from sglang_omni.config.gpus import device_env
from sglang_omni.contract.job import EngineSpec
from sglang_omni.runtime.ipc import Channel, channel_pair, pack_header
from sglang_omni.runtime.stage.process import stage_main

MiB = 1024 * 1024
FRAME = 64 * MiB
#: Generous waits for what comes in milliseconds (a loaded CI machine); not a measurement.
WAIT_S = 60.0


def spec() -> EngineSpec:
    return EngineSpec(stage="reasoner", role="reasoner", backend="scripted", model_path=None,
                      gpu=None, gpu_memory_fraction=None, factory={},
                      engine={"skip_server_warmup": True})


def submit_header() -> dict[str, Any]:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    content = [{"type": "text", "text": f"<omni-script>{script}</omni-script>"},
               {"type": "image_url", "image_url": {"url": "omni-frame://0"}}]
    return {"op": "submit", "rid": "r1", "token": 1, "media": {"keys": ["c0"], "new": ["c0"]},
            "payload": {"messages": [{"role": "user", "content": content}], "turn_index": 0}}


def next_of(inbox: queue.Queue, op: str) -> dict[str, Any]:
    while True:
        header = inbox.get(timeout=WAIT_S)
        if header.get("op") == op:
            return header


class RawStage:
    """A real stage process whose channel the test holds (it plays the server's end): ``inbox``
    gets every message header the stage sends."""

    def __init__(self) -> None:
        ours, theirs = channel_pair()
        self.sock = ours
        self.process = mp.get_context("spawn").Process(
            target=stage_main,
            args=(spec(), device_env(None), theirs, "warning", "text",
                  tempfile.mkdtemp(prefix="sgl-omni-test-")), daemon=True)
        self.process.start()
        theirs.close()
        self.channel = Channel(ours)
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        next_of(self.inbox, "ready")

    def _read(self) -> None:
        try:
            while True:
                self.inbox.put(self.channel.recv()[0])
        except (EOFError, OSError):
            self.inbox.put({"op": "gone"})

    def start_submit(self, frame_size: int) -> None:
        """Send a submit's header and its frame's length: its bytes are the caller's to send."""
        packed = pack_header(submit_header(), 1)
        self.sock.sendall(struct.pack("!Q", len(packed.head)) + packed.head)
        self.sock.sendall(struct.pack("!Q", frame_size))

    def result_and_pong(self, seq: int) -> dict[str, dict[str, Any]]:
        """Ping ``seq``; wait for the job's result and that ping's answer."""
        self.channel.send({"op": "ping", "seq": seq})
        seen: dict[str, dict[str, Any]] = {}
        while not ("result" in seen and seen.get("pong", {}).get("seq") == seq):
            header = self.inbox.get(timeout=WAIT_S)
            assert header["op"] != "gone", "the stage process exited"
            seen[header["op"]] = header
        return seen

    def close(self) -> None:
        try:
            self.channel.send({"op": "shutdown"})
        except (EOFError, OSError):
            pass
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
        self.channel.close()


@pytest.mark.server
def test_the_stage_answers_heartbeats_while_media_arrive() -> None:
    stage = RawStage()
    try:
        stage.channel.send({"op": "ping", "seq": 1})
        assert next_of(stage.inbox, "pong")["seq"] == 1
        frame = bytes(range(256)) * (FRAME // 256)
        stage.start_submit(FRAME)
        stage.sock.sendall(frame[:FRAME // 2])
        # the frame is half sent and stays so: the stage still answers, unasked
        answer = next_of(stage.inbox, "pong")
        assert answer["seq"] is None, answer
        assert next_of(stage.inbox, "pong")["seq"] is None  # and goes on answering
        stage.sock.sendall(frame[FRAME // 2:])
        assert stage.result_and_pong(2)["result"]["rid"] == "r1"
    finally:
        stage.close()


@pytest.mark.server
def test_media_still_arriving_count_as_the_servers_heartbeat() -> None:
    """The stage exits when its server sends no heartbeat for 10 s (a frozen server); a ping
    waiting behind media that keep arriving is no frozen server. The frame trickles in for
    longer than that (unasked answers sync the pace: one piece per answer)."""
    stage = RawStage()
    try:
        stage.channel.send({"op": "ping", "seq": 1})  # the stage's watch of its server begins
        assert next_of(stage.inbox, "pong")["seq"] == 1
        pieces = 40  # one piece per keep-alive answer (every 0.5 s): 20 s, past the 10 s
        piece = bytes(MiB)
        stage.start_submit(pieces * len(piece))
        for _ in range(pieces - 1):
            stage.sock.sendall(piece)
            assert next_of(stage.inbox, "pong")["seq"] is None
        assert stage.process.is_alive()
        stage.sock.sendall(piece)  # the message is whole
        assert stage.result_and_pong(2)["result"]["rid"] == "r1"
    finally:
        stage.close()
