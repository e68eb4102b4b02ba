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
from sglang_omni.runtime.stage_process import stage_main

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


@pytest.mark.server
def test_the_stage_answers_heartbeats_while_media_arrive() -> None:
    ours, theirs = channel_pair()
    scratch = tempfile.mkdtemp(prefix="sgl-omni-test-")
    process = mp.get_context("spawn").Process(
        target=stage_main, args=(spec(), device_env(None), theirs, "warning", "text", scratch),
        daemon=True)
    process.start()
    theirs.close()
    channel = Channel(ours)
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            while True:
                inbox.put(channel.recv()[0])
        except (EOFError, OSError):
            inbox.put({"op": "gone"})

    threading.Thread(target=read, daemon=True).start()
    try:
        next_of(inbox, "ready")
        channel.send({"op": "ping", "seq": 1})
        assert next_of(inbox, "pong")["seq"] == 1
        frame = bytes(range(256)) * (FRAME // 256)
        sock = ours
        packed = pack_header(submit_header(), 1)
        sock.sendall(struct.pack("!Q", len(packed.head)) + packed.head)
        sock.sendall(struct.pack("!Q", FRAME) + frame[:FRAME // 2])
        # the frame is half sent and stays so: the stage still answers, unasked
        answer = next_of(inbox, "pong")
        assert answer["seq"] is None, answer
        assert next_of(inbox, "pong")["seq"] is None  # and goes on answering
        sock.sendall(frame[FRAME // 2:])
        channel.send({"op": "ping", "seq": 2})
        seen: dict[str, dict[str, Any]] = {}
        while not ("result" in seen and seen.get("pong", {}).get("seq") == 2):
            header = inbox.get(timeout=WAIT_S)
            seen[header["op"]] = header
        assert seen["result"]["rid"] == "r1"
    finally:
        try:
            channel.send({"op": "shutdown"})
        except (EOFError, OSError):
            pass
        process.join(60)
        if process.is_alive():
            process.kill()
        channel.close()
