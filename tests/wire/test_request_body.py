"""Request bodies: size (413), type (415), JSON safety (400) and what the stage IPC cannot carry
(400 naming the field, before any work: defect 1 hung these requests)."""

from __future__ import annotations

import re

import pytest

from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.request_body import parse_json
from tests.server import Server
from tests.wire.kit import HELLO, HTTP, error_of, post_raw

MiB = 2**20


def test_body_over_the_limit_is_413_by_content_length(limited: Server) -> None:
    resp = post_raw(f"{limited.url}/generate", b" " * (MiB + 10))
    assert resp.status_code == 413 and resp.headers["connection"] == "close"
    assert "max_body_bytes" in error_of(resp)["message"]


def test_chunked_body_over_the_limit_is_cut_off(limited: Server) -> None:
    def chunks():  # no Content-Length: the server must count
        for _ in range(24):
            yield b" " * 65536

    resp = HTTP.post(f"{limited.url}/v1/chat/completions", content=chunks(),
                     headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert "max_body_bytes" in error_of(resp)["message"]


@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions"])
@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x",
                                          "application/x-www-form-urlencoded"])
def test_non_json_bodies_are_415(limited: Server, route: str, content_type: str) -> None:
    resp = post_raw(f"{limited.url}{route}", b'{"prompt": "hi"}',
                    headers={"content-type": content_type})
    assert resp.status_code == 415
    assert "application/json" in error_of(resp)["message"]


def test_json_content_types_and_none_are_read(limited: Server) -> None:
    for headers in ({"content-type": "application/json; charset=utf-8"},
                    {"content-type": "application/vnd.omni+json"}):
        resp = post_raw(f"{limited.url}/v1/chat/completions", b'{"messages": 1}', headers)
        assert resp.status_code == 400 and "messages" in error_of(resp)["message"]
    resp = HTTP.post(f"{limited.url}/v1/chat/completions", content=b'{"messages": 1}')
    assert resp.status_code == 400 and "messages" in error_of(resp)["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_messages_null_is_400(limited: Server, stream: bool) -> None:
    resp = HTTP.post(f"{limited.url}/v1/chat/completions",
                     json={"messages": None, "stream": stream})
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["message"] == \
        "messages: expected a non-empty list of chat messages"


@pytest.mark.parametrize("levels", [100_000, 1000, 65])
def test_deep_nesting_is_400(limited: Server, levels: int) -> None:
    body = b'{"prompt": "hi", "stage_params": {"reasoner": ' + b"[" * levels + b"]" * levels \
        + b"}}"
    resp = post_raw(f"{limited.url}/generate", body)
    assert resp.status_code == 400
    assert "max_json_depth" in error_of(resp)["message"]


@pytest.mark.parametrize("item", [b"{}", b"[]", b"0", b'""'])
def test_bodies_of_many_values_are_400_before_they_are_parsed(limited: Server,
                                                              item: bytes) -> None:
    """Parsed values take many times their bytes (an empty object 64 bytes for 3): a body of
    250,000 of them is refused from its commas and brackets, before it is parsed."""
    items = b",".join([item] * 250_000)
    body = b'{"prompt": "hi", "stage_params": {"reasoner": {"x": [' + items + b"]}}}"
    assert len(body) < MiB
    resp = post_raw(f"{limited.url}/generate", body)
    assert resp.status_code == 400
    message = error_of(resp)["message"]
    assert "server.max_json_values (200000)" in message, message
    fewer = b",".join([item] * 1000)
    resp = post_raw(f"{limited.url}/generate", b'{"prompt": 1, "x": [' + fewer + b"]}")
    assert resp.status_code == 400 and "max_json_values" not in error_of(resp)["message"]


@pytest.mark.parametrize("body, says", [
    (b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}", "5000 digits"),
    (b'{"prompt": "hi", "temperature": NaN}', "NaN"),
    (b'{"prompt": "hi", "temperature": -Infinity}', "Infinity"),
    (b'{"prompt": "hi", "temperature": 1e999}', "temperature: inf"),
    (b'{"prompt": "hi"', "not valid JSON"),
    (b'{"prompt": "\xff"}', "not valid UTF-8"),
])
def test_unsafe_json_is_400(limited: Server, body: bytes, says: str) -> None:
    resp = post_raw(f"{limited.url}/generate", body)
    assert resp.status_code == 400
    assert says in error_of(resp)["message"]


@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions"])
@pytest.mark.parametrize("field, value, says", [
    ("seed", b"18446744073709551616", "seed: integer 18446744073709551616 is out of range"),
    ("seed", b"-9223372036854775809", "seed: integer -9223372036854775809 is out of range"),
    ("stage_params", b'{"generation": {"seed": 18446744073709551616}}',
     "stage_params.generation.seed: integer"),
    ("stage_params", b'{"generation": {"negative_prompt": "\\udc00"}}',
     "stage_params.generation.negative_prompt: the string"),
    ("model", b'"\\ud800"', "model: the string"),
    ("user", b'{"\\ud800": 1}', "user: the key"),
])
def test_values_the_stage_wire_cannot_carry_are_400(limited: Server, route: str, field: str,
                                                    value: bytes, says: str) -> None:
    """Defect 1's repro: today this hangs until the request times out (a short client timeout
    makes the test fail fast)."""
    body = b'{"messages": [{"role": "user", "content": "hi"}], "' + field.encode() + b'": ' \
        + value + b"}"
    resp = post_raw(f"{limited.url}{route}", body, timeout=10)
    assert resp.status_code == 400, resp.text
    assert says in error_of(resp)["message"]


def test_generate_seed_repro_and_the_server_serves_after(limited: Server) -> None:
    resp = post_raw(f"{limited.url}/generate", b'{"prompt":"hi","seed":18446744073709551616}',
                    timeout=10)
    assert resp.status_code == 400
    assert error_of(resp)["message"].startswith("seed: integer 18446744073709551616")
    resp = HTTP.post(f"{limited.url}/generate", json={"prompt": "hi", "seed": 2**64 - 1})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("body, says", [
    (b'{"prompt": "\\ud800 hi"}', "prompt: the string"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content: the str"),
    (b'{"prompt": "hi", "\\udfff": 1}', "the key"),
])
def test_lone_surrogates_are_400(limited: Server, body: bytes, says: str) -> None:
    resp = post_raw(f"{limited.url}/generate", body, timeout=10)
    assert resp.status_code == 400
    assert says in error_of(resp)["message"]


@pytest.mark.parametrize("field, value", [("n", True), ("max_tokens", True), ("top_k", 1.5),
                                          ("temperature", "hot")])
def test_number_fields_refuse_booleans_and_strings(limited: Server, field: str,
                                                   value: object) -> None:
    resp = HTTP.post(f"{limited.url}/v1/chat/completions", json={**HELLO, field: value})
    assert resp.status_code == 400
    assert error_of(resp)["message"].startswith(f"{field}: expected")


@pytest.mark.parametrize(("table", "fields", "says"), [
    ("stage_sampling", {"temperature": "hot"}, "stage_sampling.reasoner.temperature: expected"),
    ("stage_params", {"top_p": [1, 2]}, "stage_params.reasoner.top_p: expected a number"),
    ("stage_sampling", {"top_k": {"x": 1}}, "stage_sampling.reasoner.top_k: expected an int"),
    ("stage_params", {"temperature": True}, "stage_params.reasoner.temperature: expected"),
])
def test_stage_tables_check_sampling_numbers_too(limited: Server, table: str, fields: dict,
                                                 says: str) -> None:
    for route, body in (("/generate", {"prompt": "hi"}), ("/v1/chat/completions", HELLO)):
        resp = HTTP.post(f"{limited.url}{route}", json={**body, table: {"reasoner": fields}})
        assert resp.status_code == 400, resp.text
        assert says in error_of(resp)["message"]


@pytest.mark.parametrize("user", [5, {"a": 1}, ["x"]])
def test_chat_user_is_a_string(limited: Server, user: object) -> None:
    resp = HTTP.post(f"{limited.url}/v1/chat/completions", json={**HELLO, "user": user})
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["message"].startswith("user: expected a string")


def test_good_unicode_and_big_valid_integers_pass(limited: Server) -> None:
    body = '{"prompt": "hi \\ud83d\\ude00 é", "seed": 18446744073709551615}'.encode()
    resp = post_raw(f"{limited.url}/generate", body)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("body, says", [
    (b'{"t": 1E+400}', "t: inf"),
    (b'{"t": 1' + b"0" * 400 + b'.0}', "t: inf"),
    (b'{"t": -9223372036854775809}', "t: integer"),
    (b'{"t": "\\uDBFF"}', "t: the string"),
    (b'{"t": ' + b"[" * 65 + b"]" * 65 + b"}", "nested deeper than 64"),
])
def test_the_wire_check_is_skipped_only_where_it_cannot_refuse(body: bytes, says: str) -> None:
    """parse_json skips the value walk for a text that can hold nothing the stage wire refuses;
    every kind of refusal still comes."""
    with pytest.raises(BadRequest, match=re.escape(says)):
        parse_json(body, 64)
    assert parse_json(b'{"t": [1.5e10, "\\u00e9", 922337203685477580]}', 64) == \
        {"t": [1.5e10, "\u00e9", 922337203685477580]}
