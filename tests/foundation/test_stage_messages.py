"""The stage wire's messages (``contract.messages``) and its framing (``runtime.ipc``): every
message type crosses the wire and comes back equal, and a message that cannot be read is a
``ProtocolError`` naming its type and field, never a KeyError or TypeError."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack
import pytest

from sglang_omni.contract import messages as m
from sglang_omni.contract.messages import ProtocolError, decode, encode
from sglang_omni.runtime.ipc import Channel, Incoming, channel_pair, pack_message, wire_pieces
from sglang_omni.runtime.stage.link import StageLink

SAMPLES: list[m.Message] = [
    m.Submit("r1", 1, {"messages": [{"role": "user", "content": "hi"}]}, 12.5,
             {"keys": ["c0", "c1"], "new": ["c1"]}),
    m.Submit("r2", 2, {}),
    m.Abort("r1"),
    m.End("r1"),
    m.Ping(7),
    m.Shutdown(),
    m.Ready(1234, True),
    m.Failed("no weights"),
    m.Fatal("the GPU fell off the bus"),
    m.Pong(7, {"decoded": 3}, {"bytes": 10, "requests": 1}, {"allocated": 5}, {"steps": 2.5}),
    m.Pong(None, {}, {}),
    m.Started("r1", 1),
    m.Chunk("r1", 1, {"step": 3}),
    m.Progress("r1", 1),
    m.Result("r1", 1, {"text": "done"}, 0.25, {"denoise": 0.2}),
    m.Error("r1", 1, "bad seed", 400, "invalid_request_error"),
    m.Aborted("r1", 1),
]


def through_the_wire(message: m.Message, frames: list[bytes]) -> tuple[Any, list[Any]]:
    """``message`` packed, cut into its wire pieces and put back together as a receiver does."""
    data = b"".join(bytes(piece) for piece in wire_pieces(pack_message(message, frames), frames))
    pieces, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from("!Q", data, at)
        pieces.append(bytearray(data[at + 8:at + 8 + size]))
        at += 8 + size
    incoming = Incoming(pieces[0])
    for piece in pieces[1:]:
        incoming.add(piece)
    assert incoming.wants() is None
    header, got = incoming.finish()
    return decode(header), got


def test_every_message_type_has_a_sample() -> None:
    assert {type(sample) for sample in SAMPLES} == set(m.MESSAGES.values())


@pytest.mark.parametrize("message", SAMPLES, ids=lambda message: type(message).__name__)
def test_every_message_crosses_the_wire_and_comes_back_equal(message: m.Message) -> None:
    frames = [b"frame one", b""] if isinstance(message, m.Submit | m.Result) else []
    got, got_frames = through_the_wire(message, frames)
    assert got == message
    assert [bytes(frame) for frame in got_frames] == frames


def test_an_optional_field_left_out_is_not_sent() -> None:
    assert encode(m.Submit("r1", 1, {})) == {"op": "submit", "rid": "r1", "token": 1,
                                              "payload": {}}


def test_a_field_added_later_is_ignored_by_an_older_reader() -> None:
    assert decode({"op": "abort", "rid": "r1", "reason": "new"}) == m.Abort("r1")


def good(op: str) -> dict[str, Any]:
    return encode(next(s for s in SAMPLES if s.op == op))


@pytest.mark.parametrize(("header", "where"), [
    ({**good("submit"), "token": "7"}, "submit.token: expected an integer, got str"),
    ({**good("submit"), "token": True}, "submit.token: expected an integer, got bool"),
    ({**good("submit"), "payload": ["a"]}, "submit.payload: expected a map, got list"),
    ({**good("submit"), "media": {"keys": [1]}}, "submit.media: expected a map of lists of "
                                                 "strings"),
    ({k: v for k, v in good("submit").items() if k != "rid"}, "submit.rid: missing"),
    ({**good("result"), "engine_s": "fast"}, "result.engine_s: expected a number, got str"),
    ({**good("result"), "payload": None}, "result.payload: expected a map, got NoneType"),
    ({**good("error"), "status": "500"}, "error.status: expected an integer, got str"),
    ({**good("pong"), "media": [1]}, "pong.media: expected a map, got list"),
    ({k: v for k, v in good("pong").items() if k != "seq"}, "pong.seq: missing"),
    ({**good("ready"), "pid": 1.5}, "ready.pid: expected an integer, got float"),
    ({"op": "launch", "rid": "r1"}, "op: 'launch' is not a message type"),
    ({"rid": "r1"}, "op: None is not a message type"),
    (["submit"], "(message): expected a map, got list"),
])
def test_a_bad_field_is_a_protocol_error_naming_it(header: Any, where: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode(header)
    assert f"stage protocol error: {where}" in str(caught.value)


def test_a_message_sent_the_wrong_way_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="'result' is not a message a stage is sent"):
        m.decode_to_stage(good("result"))
    with pytest.raises(ProtocolError, match="'submit' is not a message a stage sends"):
        m.decode_to_server(good("submit"))


@pytest.mark.parametrize(("piece", "where"), [
    (b"\xc1", "(header): not msgpack"),
    (msgpack.packb([1, 2]), "(header): expected a map, got list"),
    (msgpack.packb({"op": "abort", "rid": "r", "nframes": -1}), "abort.nframes: expected a count"),
    (msgpack.packb({"op": "abort", "nframes": "2"}), "abort.nframes: expected a count"),
    (msgpack.packb({"op": "submit", "nframes": 1, "b64frames": "0"}),
     "submit.b64frames: expected a list of integers"),
])
def test_a_header_that_is_not_one_is_a_protocol_error(piece: bytes, where: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        Incoming(bytearray(piece))
    assert f"stage protocol error: {where}" in str(caught.value)


def test_the_stage_end_reads_on_after_a_garbled_header() -> None:
    """``Channel.recv`` raises ProtocolError for a hand-built bad header and reads the next
    message in step."""
    ours, theirs = channel_pair()
    reader = Channel(theirs)
    bad = msgpack.packb(["not", "a", "header"])
    ours.sendall(struct.pack("!Q", len(bad)) + bad)
    Channel(ours).send(m.Ping(3))
    with pytest.raises(ProtocolError, match="expected a map, got list"):
        reader.recv()
    header, _ = reader.recv()
    assert m.decode_to_stage(header) == m.Ping(3)
    reader.close()
    ours.close()


def test_the_server_end_reads_on_after_a_garbled_header(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """``StageLink`` logs a hand-built bad header from the stage as a protocol error, drops
    it, and hands on the next message in step."""
    ours, theirs = channel_pair()

    async def main() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        arrived = asyncio.Event()

        def on_message(header: dict[str, Any], frames: list) -> None:
            got.append(header)
            arrived.set()

        link = StageLink(ours, on_message, lambda: None, name="test")
        bad = msgpack.packb({"op": "result", "nframes": "many"})
        theirs.sendall(struct.pack("!Q", len(bad)) + bad)
        Channel(theirs).send(m.Progress("r1", 1))
        await asyncio.wait_for(arrived.wait(), 30)
        link.close()
        return got

    with caplog.at_level("ERROR", logger="sglang_omni.runtime"):
        got = asyncio.run(main())
    assert [m.decode_to_server(header) for header in got] == [m.Progress("r1", 1)]
    assert "stage protocol error: result.nframes: expected a count, got 'many'" in caplog.text
    theirs.close()
