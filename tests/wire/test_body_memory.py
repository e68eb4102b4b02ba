"""A large JSON body is held about once while it is read and parsed (and once more by at most
one media payload as that payload ends), and little more while it is sent to a stage (issue 26,
5.7: a 150 MB body grew the server by 2.9x its size). Peaks are measured with tracemalloc; the
server-level figure is ``benchmarks/body_memory.py``'s."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import socket
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from starlette.applications import Starlette
from starlette.requests import Request

from sglang_omni.errors import BadRequest
from sglang_omni.runtime.ipc import Channel, channel_pair, pack_header
from sglang_omni.serve.bodies.body_formats import form_value
from sglang_omni.serve.bodies.body_runs import MIN_RUN, RunSplitter
from sglang_omni.serve.bodies.msgpack_body import decode_msgpack, read_msgpack_body
from sglang_omni.serve.bodies.msgpack_runs import StringSplitter
from sglang_omni.serve.bodies.multipart_body import read_form
from sglang_omni.serve.bodies.request_body import parse_json, read_json_body

MiB = 2**20


def b64(size: int, seed: int) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()


def request_of(body: bytes, chunk: int = 65536,
               content_type: str = "application/json") -> Request:
    """A Starlette request whose body arrives in ``chunk``-byte messages (each dropped once
    read)."""
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)]
    pieces.reverse()

    async def receive() -> dict[str, Any]:
        if pieces:
            return {"type": "http.request", "body": pieces.pop(), "more_body": bool(pieces)}
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (b"content-type", content_type.encode())], "app": Starlette(), "query_string": b""}
    return Request(scope, receive)


def peak_of(work: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def split(body: bytes, sizes: list[int]) -> Any:
    runs = RunSplitter()
    at = 0
    while at < len(body):
        step = sizes[at % len(sizes)]
        runs.feed(body[at:at + step])
        at += step
    runs.finish()
    return parse_json(runs.text, 64, 10**6, runs), runs


DOCS = [
    {"a": "data:image/png;base64," + b64(1_500_000, 1), "b": [b64(2_000_000, 2), "x", "AAAA"],
     b64(1_100_000, 3): 3},
    ["data:video/mp4;base64," + b64(900_000, 4) + "\n" + b64(1_000_000, 5),
     'a"b' + b64(1_200_000, 6), "\u00e9" + b64(1_200_000, 7)],
    {"n": 12345, "t": "data:image/png;base64," + b64(2_000_000, 8) + "?", "u": "short"},
]


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("sizes", [[65536], [7, 1000, 65536], [MiB * 16]])
def test_a_body_parsed_with_its_payloads_set_aside_is_the_same_value(doc: Any,
                                                                     sizes: list[int]) -> None:
    value, runs = split(json.dumps(doc).encode(), sizes)
    assert value == doc
    assert not runs.runs  # every payload given up to the value


def test_long_payloads_are_set_aside_and_short_ones_stay() -> None:
    doc = {"big": "data:image/png;base64," + b64(MIN_RUN, 1), "bare": b64(MIN_RUN, 2),
           "small": "data:image/png;base64," + b64(1000, 3)}
    runs = RunSplitter()
    runs.feed(json.dumps(doc).encode())
    runs.finish()
    assert len(runs.runs) == 2 and len(runs.text) < 3000


@pytest.mark.parametrize("broken", [b'"b": 1,,}', b'"b": 1 "c"}', b'"\xff": 1}'])
def test_a_broken_body_is_refused_with_the_offsets_of_the_body_itself(broken: bytes) -> None:
    body = json.dumps({"a": "data:;base64," + b64(1_500_000, 1)}).encode()[:-1] + b", " + broken
    with pytest.raises(BadRequest) as ours:
        split(body, [65536])
    try:
        json.loads(body.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        expected = f"at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else \
            f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
    else:
        raise AssertionError("the broken body parses")
    assert expected in str(ours.value)


def test_a_quote_or_backslash_never_moves_into_a_payload() -> None:
    # base64 after a closing quote is no JSON; set aside or not, the body stays refused
    body = b'{"a": "x"' + b"A" * (2 * MIN_RUN) + b'"}'
    with pytest.raises(BadRequest, match="not valid JSON"):
        split(body, [65536])


def test_reading_a_large_body_holds_it_about_once() -> None:
    parts = [f"data:image/png;base64,{b64(6 * MiB, seed)}" for seed in range(3)]
    body = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}} for url in parts]}]}).encode()
    del parts
    value, peak = peak_of(lambda: asyncio.run(read_json_body(request_of(body))))
    assert value == json.loads(body)
    assert peak < 1.5 * len(body), f"peak {peak / len(body):.2f}x the body"


def test_sending_a_header_of_long_strings_holds_little_more() -> None:
    texts = [f"data:image/png;base64,{b64(3 * MiB, seed)}" for seed in range(3)]
    header = {"op": "submit", "payload": {"messages": [
        {"content": [{"url": t} for t in texts]}], "note": "\u00e9" * 10}}
    total = sum(map(len, texts))
    ours, theirs = channel_pair()
    drained = threading.Thread(target=_drain, args=(theirs,), daemon=True)
    drained.start()
    try:
        _, peak = peak_of(lambda: Channel(ours).send_packed(pack_header(header, 1), [b"frame"]))
    finally:
        ours.close()
        drained.join(10)
    assert peak < 0.2 * total, f"peak {peak / total:.2f}x the strings"


def _drain(sock: socket.socket) -> None:
    buf = bytearray(MiB)
    while sock.recv_into(buf):
        pass
    sock.close()


def test_long_strings_cross_the_stage_wire_in_their_places() -> None:
    big = "data:video/mp4;base64," + b64(2 * MiB, 1)
    header = {"op": "submit", "payload": {"a": [big, ("x", big)], "b": {"c": big},
                                          "d": "\u00e9" * MiB, "e": 1}}
    ours, theirs = channel_pair()
    reader = Channel(theirs)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(reader.recv()), daemon=True)
    thread.start()
    Channel(ours).send(header, [b"one", bytearray(b"two")])
    thread.join(30)
    ours.close()
    theirs.close()
    received, frames = got[0]
    assert received == {"op": "submit", "payload": {"a": [big, ["x", big]], "b": {"c": big},
                                                    "d": "\u00e9" * MiB, "e": 1}}
    assert [bytes(f) for f in frames] == [b"one", b"two"]


@pytest.mark.parametrize("shape", ["data_url", "bare", "embedded"])
def test_a_body_of_one_large_payload_peaks_under_one_and_a_half_times_it(shape: str) -> None:
    """Issue 33, 5: a body that is mostly one payload (a 64 MiB image is 85 MiB of base64)
    peaked at twice its size, its bytes and its text at once as the payload was made text."""
    payload = b64(12 * MiB, 9)
    text = {"data_url": f"data:image/png;base64,{payload}", "bare": payload,
            "embedded": f"\u00e9: data:image/png;base64,{payload} (a photo)"}[shape]
    body = json.dumps({"prompt": "describe", "images": [text]}).encode()
    del payload, text
    value, peak = peak_of(lambda: asyncio.run(read_json_body(request_of(body))))
    assert value == json.loads(body)
    assert peak <= 1.5 * len(body), f"peak {peak / len(body):.2f}x the body"


def test_a_form_of_large_uploads_peaks_under_one_and_a_half_times_it() -> None:
    """Issue 33, 5: a form peaked at 2.34x its size, its body read whole and then each upload's
    data URL text (4/3 of the upload) made beside it. The uploads are made text as they
    arrive now: the text and a window."""
    uploads = [b"\x89PNG\r\n\x1a\n" + random.Random(seed).randbytes(4 * MiB) for seed in range(3)]
    body = b"".join(
        b'--XyZ\r\nContent-Disposition: form-data; name="image[]"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + u + b"\r\n" for u in uploads)
    body = b'--XyZ\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhi\r\n' + body + \
        b"--XyZ--\r\n"
    request = request_of(body, content_type="multipart/form-data; boundary=XyZ")

    async def read() -> Any:
        return form_value(await read_form(request), {})

    value, peak = peak_of(lambda: asyncio.run(read()))
    assert value == {"prompt": "hi", "image": [
        "data:image/png;base64," + base64.b64encode(u).decode() for u in uploads]}
    assert peak <= 1.5 * len(body), f"peak {peak / len(body):.2f}x the body"


def set_aside(raw: bytes, step: int, min_string: int = 64) -> Any:
    strings = StringSplitter(min_string)
    for at in range(0, len(raw), step):
        strings.feed(raw[at:at + step])
    strings.finish()
    return decode_msgpack(strings.text, 64, (), 10**6, strings), strings


MSGPACK_DOCS = [
    {"prompt": "describe", "images": ["data:image/png;base64," + b64(3000, 1), "x" * 31,
                                      "y" * 32, "\u00e9\u4e2d" * 5000, ""],
     "n": [1, -1, 2**40, -(2**40), 1.5, True, None, {"k": b64(200, 2)}], b64(100, 3): 255},
    ["z" * 64, ["z" * 63, "z" * 65535, "z" * 65536], {"a": {"b": {"c": "\u00e9" * 100}}}],
]


@pytest.mark.parametrize("doc", MSGPACK_DOCS)
@pytest.mark.parametrize("step", [1, 3, 1000, 65536])
def test_a_msgpack_body_with_its_strings_set_aside_is_the_same_value(doc: Any,
                                                                     step: int) -> None:
    value, strings = set_aside(msgpack.packb(doc), step)
    assert value == doc
    assert strings.strings and len(strings.text) < len(msgpack.packb(doc)) // 2


def test_a_client_ext_value_is_never_taken_for_a_string_set_aside() -> None:
    key = bytes(16) + (0).to_bytes(4, "big")
    raw = msgpack.packb({"a": "s" * 100, "b": msgpack.ExtType(77, key)})
    strings = StringSplitter(64)
    strings.feed(raw)
    strings.finish()
    value = msgpack.unpackb(strings.text, raw=False, ext_hook=strings.ext_hook)
    assert value == {"a": "s" * 100, "b": msgpack.ExtType(77, key)}


@pytest.mark.parametrize(("raw", "says"), [
    (msgpack.packb({"a": "s" * 100})[:-5], "incomplete input"),
    (msgpack.packb({"a": "s" * 100}) + b"\x01", "extra data"),
    (msgpack.packb({"a": "s" * 100})[:-100] + b"\xff" * 100, "not valid UTF-8"),
    (b"\x82\xa1a\xc1" + b"\x00" * 100, "not valid msgpack"),
])
def test_a_broken_msgpack_body_is_still_refused(raw: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        set_aside(raw, 7)


def test_a_msgpack_body_of_too_many_values_is_read_no_further_and_refused() -> None:
    raw = msgpack.packb([{"k": "s" * 100}] * 40)
    strings = StringSplitter(64, max_values=10)
    strings.feed(raw)
    strings.finish()
    assert 0 < len(strings.strings) < 40  # then the rest is copied through unread
    with pytest.raises(BadRequest, match="server.max_json_values"):
        decode_msgpack(strings.text, 64, (), 10, strings)


def test_a_msgpack_body_of_large_strings_peaks_under_one_and_a_half_times_it() -> None:
    """Issue 33, 5: a msgpack body peaked at 2.00x its size, read whole and then unpacked. Its
    long strings are set aside as they arrive now: the strings, the rest and a chunk."""
    urls = [f"data:image/png;base64,{b64(3 * MiB, seed)}" for seed in range(3)]
    body = msgpack.packb({"prompt": "describe", "images": urls, "seed": 7})
    request = request_of(body, content_type="application/msgpack")
    value, peak = peak_of(lambda: asyncio.run(read_msgpack_body(request)))
    assert value == {"prompt": "describe", "images": urls, "seed": 7}
    assert peak <= 1.5 * len(body), f"peak {peak / len(body):.2f}x the body"
