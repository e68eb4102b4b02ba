"""The form and msgpack readers (unit): parsing, limits and the values they become before a
route's model validates them. Over HTTP: tests/generation/test_native_media_routes.py."""

from __future__ import annotations

import base64
import json
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_omni.errors import BadRequest, UnsupportedMediaType
from sglang_omni.serve.bodies.body_formats import accepts, data_url, form_value, formats_of
from sglang_omni.serve.bodies.msgpack_body import (
    decode_msgpack,
    native_array,
    pack_msgpack,
    with_native_arrays,
)
from sglang_omni.serve.bodies.multipart_body import (
    MAX_FORM_PARTS,
    Form,
    FormReader,
    Upload,
    boundary_of,
    parse_form,
    parse_urlencoded,
)
from sglang_omni.serve.bodies.request_body import json_values_bound
from sglang_omni.serve.schemas.direct import ImageEditRequest, VideoGenerationRequest

B = b"XyZ"


def part(name: str, value: bytes, filename: str | None = None,
         content_type: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"Content-Disposition: {disposition}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return b"--" + B + b"\r\n" + head.encode() + b"\r\n" + value + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--" + B + b"--\r\n"


# --- multipart ---------------------------------------------------------------------------------
def test_fields_and_uploads_are_split_in_order() -> None:
    form = parse_form(body(part("prompt", "été".encode()), part("seed", b"7"),
                           part("image", b"\x89PNG\r\n--XyZ-not-a-boundary", "a.png",
                                "image/png")), B)
    assert form.fields == [("prompt", "été"), ("seed", "7")]
    assert form.files == [Upload("image", "a.png", "image/png", url="data:image/png;base64,"
                                 + base64.b64encode(b"\x89PNG\r\n--XyZ-not-a-boundary").decode())]


@pytest.mark.parametrize("step", [1, 2, 5, 7, 64])
def test_a_form_fed_in_any_pieces_is_the_same_form(step: int) -> None:
    """The form is parsed as the body streams in: a boundary split across chunks, or bytes
    that look like one, change nothing."""
    data = b"\r\n--XyZ\r\x89PNG\r\n--XyZ-" + bytes(range(256)) * 3 + b"\r\n--XyZ-x"
    raw = body(part("prompt", "été".encode()), part("image", data, "a.png"),
               part("video", b"", "b.mp4"), part("seed", b"7"))
    reader = FormReader(B)
    for at in range(0, len(raw), step):
        reader.feed(raw[at:at + step])
    form = reader.finish()
    assert form == parse_form(raw, B)
    assert form.fields == [("prompt", "été"), ("seed", "7")]
    assert [data_url(u) for u in form.files] == [
        "data:image/png;base64," + base64.b64encode(data).decode(), "data:video/mp4;base64,"]


@pytest.mark.parametrize(("raw", "says"), [
    (b"no boundary here", "holds no part"),
    (b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--", "names no field"),
    (b"--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--", "Content-Disposition"),
    (b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\nnever closed', "ends inside"),
    (b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\n\xff\r\n--XyZ--', "UTF-8"),
    (b"--XyZ junk", "CRLF"),
])
def test_malformed_forms_are_400(raw: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        parse_form(raw, B)


def test_part_count_and_head_size_are_bounded() -> None:
    with pytest.raises(BadRequest, match=f"more than {MAX_FORM_PARTS} parts"):
        parse_form(body(*[part(f"f{i}", b"1") for i in range(MAX_FORM_PARTS + 1)]), B)
    huge = b"--XyZ\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\nx\r\n--XyZ--"
    with pytest.raises(BadRequest, match="header lines"):
        parse_form(huge, B)


def test_content_types() -> None:
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
    with pytest.raises(UnsupportedMediaType):
        boundary_of("text/plain")
    with pytest.raises(BadRequest, match="boundary"):
        boundary_of("multipart/form-data")


def test_urlencoded_forms() -> None:
    assert parse_urlencoded(b"prompt=a%20cat&n=1&x=").fields == [("prompt", "a cat"), ("n", "1"),
                                                                ("x", "")]
    with pytest.raises(BadRequest, match="UTF-8"):
        parse_urlencoded(b"prompt=%ff")


# --- the value a form becomes -----------------------------------------------------------------
VIDEO = VideoGenerationRequest.model_json_schema()["properties"]
EDIT = ImageEditRequest.model_json_schema()["properties"]


def test_text_fields_take_the_models_types() -> None:
    form = Form([("prompt", "12"), ("num_frames", "5"), ("guidance_scale", "4.5"),
                 ("generate_sound", "true"), ("use_guardrails", "0"), ("seed", ""),
                 ("action", "[[0.5, 1]]"), ("extra_params", '{"fps": 8}'), ("mystery", "[1]"),
                 ("words", "plain text")], [])
    assert form_value(form, VIDEO) == {
        "prompt": "12", "num_frames": 5, "guidance_scale": 4.5, "generate_sound": True,
        "use_guardrails": False, "action": [[0.5, 1]], "extra_params": '{"fps": 8}',
        "mystery": [1], "words": "plain text"}


@pytest.mark.parametrize(("field", "text", "says"), [
    ("num_frames", "five", "num_frames: expected an integer, got 'five'"),
    ("guidance_scale", "x", "guidance_scale: expected a number"),
    ("generate_sound", "maybe", "generate_sound: expected true or false"),
    ("action", "[1", "action: expected a JSON array"),
])
def test_wrong_text_is_400_naming_the_field(field: str, text: str, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        form_value(Form([(field, text)], []), VIDEO)


def test_uploads_become_data_urls_and_lists_collect() -> None:
    upload = Upload("image[]", "cat.png", None, b"\x89PNG")
    form = Form([("url[]", "https://example.com/a.png"), ("url", "https://example.com/b.png")],
                [upload, Upload("image", "dog.jpg", "application/octet-stream", b"\xff\xd8")])
    value = form_value(form, EDIT)
    assert value["url"] == ["https://example.com/a.png", "https://example.com/b.png"]
    assert value["image"] == ["data:image/png;base64," + base64.b64encode(b"\x89PNG").decode(),
                              data_url(form.files[1])]
    assert value["image"][1].startswith("data:image/jpeg;base64,")
    with pytest.raises(BadRequest, match="prompt: sent more than once"):
        form_value(Form([("prompt", "a"), ("prompt", "b")], []), EDIT)


def test_an_untyped_upload_takes_the_type_its_bytes_show_not_its_name() -> None:
    """Admission refuses bytes of another type than declared; a name is no declaration."""
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
    for content_type in (None, "application/octet-stream"):
        upload = Upload("image", "photo.jpg", content_type, png)
        assert data_url(upload).startswith("data:image/png;base64,")
    assert data_url(Upload("image", "notes.txt", None, b"hello")).startswith("data:text/plain")


def test_an_upload_is_made_a_data_url_holding_little_more_than_the_two() -> None:
    """Issue 33, 5: the data URL of a 16 MiB upload took its base64 bytes and two copies of its
    text beside the body (2.67x the body more, tracemalloc). Its text alone is 1.33x the
    upload: that, and a window, is what it takes now."""
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (16 * 4096)
    raw = body(part("prompt", b"a cat"), part("input_reference", data, "a.png", "image/png"))
    del data
    tracemalloc.start()
    try:
        value = form_value(parse_form(raw, B), {})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value["input_reference"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert peak <= 1.4 * len(raw), f"peak {peak / len(raw):.2f}x the body beside it"


def test_the_openapi_entry_names_the_formats() -> None:
    extra = accepts("multipart/form-data", "application/msgpack", uploads=("image",))
    assert formats_of(extra) == ("multipart/form-data", "application/msgpack")
    assert formats_of(None) == ()


# --- msgpack -----------------------------------------------------------------------------------
def native(array: np.ndarray, keys: type = bytes) -> dict:
    def key(name: str) -> object:
        return name.encode() if keys is bytes else name

    return {key("__ndarray__"): True, key("data"): array.tobytes(), key("dtype"): array.dtype.str,
            key("shape"): list(array.shape)}


@pytest.mark.parametrize("keys", [bytes, str])
def test_native_arrays_become_tensor_payloads(keys: type) -> None:
    pixels = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    raw = msgpack.packb({"input": {"image": native(pixels, keys)}}, use_bin_type=True)
    value = decode_msgpack(raw, 64)
    assert value == {"input": {"image": {"values": pixels.tolist(), "dtype": "|u1",
                                         "shape": [2, 2, 3]}}}


@pytest.mark.parametrize(("value", "says"), [
    ({"a": {"__ndarray__": True, "data": b"\0" * 3, "dtype": "|u1", "shape": [2, 2]}},
     "a: shape \\[2, 2\\] of |u1 needs 4 bytes, got 3"),
    ({"a": {"__ndarray__": True, "data": b"", "dtype": "|O", "shape": [0]}}, "a.dtype"),
    ({"a": {"__ndarray__": True, "data": b"", "dtype": "nope", "shape": [0]}}, "a.dtype"),
    ({"a": b"raw bytes"}, "a: binary data is read only as a numpy array"),
    ({1: "x"}, "map keys must be text"),
    ({"a": float("nan")}, "a: nan is not a finite number"),
])
def test_bad_msgpack_values_are_400(value: object, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        decode_msgpack(msgpack.packb(value, use_bin_type=True), 64)


@pytest.mark.parametrize("levels", [70, 600])
def test_msgpack_nested_too_deep_is_400(levels: int) -> None:
    deep: object = []
    for _ in range(levels):
        deep = [deep]
    with pytest.raises(BadRequest, match="max_json_depth"):
        decode_msgpack(msgpack.packb({"a": deep}), 64)


def test_msgpack_nested_past_its_reader_names_the_limit() -> None:
    """100,000 levels: msgpack's reader stops with an error that has no message ("the body
    is not valid msgpack: " and nothing after it)."""
    with pytest.raises(BadRequest, match=r"nested deeper than 64 levels "
                                         r"\(server.max_json_depth\)"):
        decode_msgpack(b"\x91" * 100_000 + b"\xc0", 64)


def test_msgpack_depth_and_syntax() -> None:
    with pytest.raises(BadRequest, match="not valid msgpack"):
        decode_msgpack(b"\xc1", 64)
    assert decode_msgpack(msgpack.packb({"f": b"\x89PNG"}), 64, binary_ok={"f"}) == \
        {"f": b"\x89PNG"}


def test_msgpack_values_are_counted_as_they_are_built() -> None:
    nested = {"a": [[0] * 6, [0] * 6]}  # 1 member, 2 items, 12 items: 15 values and the top
    assert decode_msgpack(msgpack.packb(nested), 64, (), 16) == nested
    with pytest.raises(BadRequest, match=r"server.max_json_values \(15\)"):
        decode_msgpack(msgpack.packb(nested), 64, (), 15)
    with pytest.raises(BadRequest, match=r"server.max_json_values \(1000\)"):  # one long map
        decode_msgpack(msgpack.packb({str(i): 0 for i in range(1001)}), 64, (), 1000)
    with pytest.raises(BadRequest, match="max_json_values"):  # millions of tiny maps, at once
        decode_msgpack(msgpack.packb([[{}] * 500_000] * 8), 64, (), 1_000_000)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                    max_leaves=30))
def test_the_json_bound_counts_every_value(value: object) -> None:
    def count(v: object) -> int:
        if isinstance(v, list):
            return 1 + sum(count(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(count(x) for x in v.values())
        return 1

    raw = json.dumps(value).encode()
    assert json_values_bound(raw) >= count(value)


def test_answers_carry_native_float32_arrays() -> None:
    answer = {"data": [{"action": {"values": [[0.5, -1.0]], "shape": [1, 2]}}]}
    packed = msgpack.unpackb(pack_msgpack(with_native_arrays(answer)), raw=False,
                             strict_map_key=False)
    values = packed["data"][0]["action"]["values"]
    assert values[b"dtype"] == "<f4" and values[b"shape"] == [1, 2]
    assert np.frombuffer(values[b"data"], np.float32).tolist() == [0.5, -1.0]
    assert native_array([1.0])[b"__ndarray__"] is True
