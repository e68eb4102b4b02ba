"""The server's end of a stage channel on the event loop (``runtime.stage.link``) speaks the
stage's wire (``ipc.Channel``): messages of every size arrive whole and in order both ways, a
long text travels beside its header, a base64 frame (a client's inline medium) travels as its
text and arrives as its bytes, and a peer that goes away fails what is not sent and says it is
lost."""

from __future__ import annotations

import asyncio
import base64
import random
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from sglang_omni.media.inline import InlinePayload, parse_data_url
from sglang_omni.runtime.ipc import MIN_TEXT, Channel, channel_pair, pack_header, pack_message
from sglang_omni.runtime.stage import link as link_module
from sglang_omni.runtime.stage.link import STAGING, StageLink

MiB = 1024 * 1024


def echo(channel: Channel, count: int) -> None:
    """The stage's side: send back each of ``count`` messages as it came."""
    for _ in range(count):
        header, frames = channel.recv()
        channel.send(header, frames)


def messages() -> list[tuple[dict[str, Any], list[bytes]]]:
    out: list[tuple[dict[str, Any], list[bytes]]] = []
    for i in range(200):  # many small ones: several share one read
        out.append(({"op": "small", "i": i}, [bytes([i % 256]) * (i % 7)]))
    out.append(({"op": "empty-frame"}, [b""]))
    out.append(({"op": "staging-sized"}, [b"s" * (STAGING - 8), b"t" * STAGING]))
    out.append(({"op": "large", "note": "x"}, [bytes(range(256)) * (9 * MiB // 256)]))
    out.append(({"op": "text", "url": "data:," + "a" * (2 * MiB), "short": "b"}, []))
    out.append(({"op": "last"}, []))
    return out


def test_messages_of_every_size_cross_both_ways_whole_and_in_order() -> None:
    sent = messages()
    assert len(sent[-2][0]["url"]) >= MIN_TEXT  # it travels beside the header

    async def main() -> list[tuple[dict[str, Any], list[bytes]]]:
        ours, theirs = channel_pair()
        peer = threading.Thread(target=echo, args=(Channel(theirs), len(sent)), daemon=True)
        peer.start()
        got: list[tuple[dict[str, Any], list[bytes]]] = []
        done = asyncio.get_running_loop().create_future()
        errors: list[BaseException] = []

        def on_message(header: dict[str, Any], frames: list) -> None:
            got.append((header, [bytes(f) for f in frames]))
            if header["op"] == "last":
                done.set_result(None)

        link = StageLink(ours, on_message, lambda: None)
        for header, frames in sent:  # all queued at once: most wait for the socket to drain
            link.send(pack_header(header, len(frames)), frames, errors.append)
        await asyncio.wait_for(done, 60)
        link.close()
        peer.join(10)
        assert not errors
        return got

    assert asyncio.run(main()) == sent


def test_a_peer_that_goes_away_fails_what_is_queued_and_is_lost() -> None:
    async def main() -> None:
        ours, theirs = channel_pair()
        lost = asyncio.Event()
        errors: list[BaseException] = []
        link = StageLink(ours, lambda header, frames: None, lost.set)
        theirs.close()
        await asyncio.wait_for(lost.wait(), 10)
        link.send(pack_header({"op": "ping"}), None, errors.append)
        await asyncio.sleep(0)
        assert link.closed and len(errors) == 1 and isinstance(errors[0], EOFError)

    asyncio.run(main())


def test_what_the_stage_sent_before_it_went_is_still_read() -> None:
    async def main() -> None:
        ours, theirs = channel_pair()
        Channel(theirs).send({"op": "fatal", "message": "gone"})
        theirs.close()
        got: list[dict[str, Any]] = []
        lost = asyncio.Event()
        link = StageLink(ours, lambda header, frames: got.append(header), lost.set)
        link.send(pack_header({"op": "ping"}), [b"x" * MiB], lambda exc: None)
        await asyncio.wait_for(lost.wait(), 10)
        assert got == [{"op": "fatal", "message": "gone"}]

    asyncio.run(main())


def test_drain_hands_on_at_once_every_message_the_stage_sent_before_it_exited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The handle reads what an exited stage left in the socket before it handles the exit
    (its reason for failing to start came second to the exit, and the server said only "exited
    with code 1"): ``drain`` takes it all in one call, past one read budget, before the
    loop's reader would."""
    monkeypatch.setattr(link_module, "READ_BUDGET", 1024)  # the messages span several reads
    sent = [({"op": "small"}, [b"a"]), ({"op": "larger"}, [b"b" * 8192]),
            ({"op": "failed", "message": "no checkpoint"}, [])]

    async def main() -> None:
        ours, theirs = channel_pair()
        for header, frames in sent:  # they fit the socket's buffer: sent before any read
            Channel(theirs).send(header, frames)
        theirs.close()
        got: list[dict[str, Any]] = []
        link = StageLink(ours, lambda header, frames: got.append(header), lambda: None)
        link.drain()  # no loop step in between: the reader callback has not run
        assert got == [h for h, _ in sent] and link.closed

    asyncio.run(main())


def test_a_message_still_arriving_says_the_stage_is_alive() -> None:
    """A large result holds back the stage's heartbeat answers (one channel, in order): while
    its bytes arrive, ``on_bytes`` says the stage is alive (the handle counts it as an answer),
    before the message is whole."""
    frame = bytes(range(256)) * (16 * MiB // 256)
    packed = pack_header({"op": "result"}, 1)

    async def main() -> None:
        ours, theirs = channel_pair()
        rest = threading.Event()

        def stage() -> None:  # the header and half the frame; the rest when told
            theirs.sendall(len(packed.head).to_bytes(8, "big") + packed.head)
            theirs.sendall(len(frame).to_bytes(8, "big"))
            theirs.sendall(frame[:len(frame) // 2])
            rest.wait(60)
            theirs.sendall(frame[len(frame) // 2:])

        alive = asyncio.Event()
        whole = asyncio.get_running_loop().create_future()
        link = StageLink(ours, lambda header, frames: whole.set_result((header, frames)),
                         lambda: None, on_bytes=alive.set)
        peer = threading.Thread(target=stage, daemon=True)
        peer.start()
        await asyncio.wait_for(alive.wait(), 60)
        assert not whole.done()  # alive before the message is whole
        rest.set()
        header, frames = await asyncio.wait_for(whole, 60)
        assert header["op"] == "result" and bytes(frames[0]) == frame
        link.close()
        peer.join(10)
        theirs.close()

    asyncio.run(main())


# --- base64 frames: a client's inline media, decoded as they arrive ------------------------------
def _b64_payload(data: bytes, prefix: str = "data:image/png;base64,") -> InlinePayload:
    return parse_data_url(prefix + base64.b64encode(data).decode())


def _received(send: Callable[[Channel], None], count: int = 1
              ) -> list[tuple[dict[str, Any], list[bytearray]]]:
    """What the stage's ``Channel.recv`` gets of ``count`` messages ``send`` writes."""
    ours, theirs = channel_pair()
    got: list[tuple[dict[str, Any], list[bytearray]]] = []
    reader = Channel(theirs)
    thread = threading.Thread(target=lambda: got.extend(reader.recv() for _ in range(count)),
                              daemon=True)
    thread.start()
    try:
        send(Channel(ours))
        thread.join(30)
    finally:
        ours.close()
        theirs.close()
    assert len(got) == count
    return got


@pytest.mark.parametrize("size", [1, 2, 3, 4, 3 * MiB // 4 * 3 + 1, 3 * MiB + 2])
def test_a_base64_frame_arrives_as_the_bytes_it_decodes_to(size: int) -> None:
    """Every padding, a frame within one window and one over several."""
    data = random.Random(size).randbytes(size)
    frames: list[Any] = [b"raw", _b64_payload(data), bytearray(b"more"),
                         InlinePayload(base64.b64encode(b"bare").decode(), None)]
    [(header, received)] = _received(lambda c: c.send({"op": "submit", "n": 1}, frames))
    assert header == {"op": "submit", "n": 1}  # b64frames is the wire's, not the message's
    assert [bytes(f) for f in received] == [b"raw", data, b"more", b"bare"]


def test_a_frame_that_is_not_base64_is_reported_and_the_next_message_stays_whole() -> None:
    bad = InlinePayload("QUJD" * 300_000 + "QU!=", None)  # a wrong character in the last window

    def send(channel: Channel) -> None:
        channel.send({"op": "submit", "rid": "a"}, [bad, b"after"])
        channel.send({"op": "submit", "rid": "b"}, [_b64_payload(b"fine")])

    (first, frames), (second, next_frames) = _received(send, 2)
    assert "not strict base64" in first["wire_error"] and frames == [b"", b"after"]
    assert "wire_error" not in second and next_frames == [b"fine"]


def test_the_stage_holds_a_base64_frame_as_its_bytes_never_as_text() -> None:
    data = random.Random(5).randbytes(12 * MiB)
    frame = _b64_payload(data)
    text_size = len(frame.text) - frame.start
    ours, theirs = channel_pair()
    sender = threading.Thread(target=lambda: Channel(ours).send({"op": "submit"}, [frame]),
                              daemon=True)
    sender.start()
    tracemalloc.start()
    try:
        _, [received] = Channel(theirs).recv()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        sender.join(30)
        ours.close()
        theirs.close()
    assert received == data
    # the bytes (3/4 of the text) and windows: the receiver's window and its decoded piece, the
    # sender's slice of text and its ASCII copy (both threads are traced: whether their windows
    # peak at once is up to the scheduler), about 4 MiB; the text arriving whole would add 16
    assert peak < len(data) + 6 * MiB, f"peak {peak / text_size:.2f}x the text"


def test_the_server_end_sends_base64_frames_as_text_and_the_stage_decodes_them() -> None:
    data = random.Random(3).randbytes(5 * MiB + 1)
    frame = _b64_payload(data, "data:video/mp4;base64,")

    async def main() -> tuple[dict[str, Any], list[bytes]]:
        ours, theirs = channel_pair()
        peer = threading.Thread(target=echo, args=(Channel(theirs), 1), daemon=True)
        peer.start()
        done: asyncio.Future[tuple[dict[str, Any], list[bytes]]] = \
            asyncio.get_running_loop().create_future()
        link = StageLink(ours, lambda h, f: done.set_result((h, [bytes(x) for x in f])),
                         lambda: None)
        packed = pack_message({"op": "submit"}, [b"x", frame])
        assert packed.nbytes < 100  # the text travels as a frame, not in the header
        link.send(packed, [b"x", frame])
        got = await asyncio.wait_for(done, 60)
        link.close()
        peer.join(10)
        return got

    header, frames = asyncio.run(main())
    assert header == {"op": "submit"} and frames == [b"x", data]  # echoed back as bytes
