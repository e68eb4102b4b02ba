"""Who may call: with an API key every route but /health needs ``Authorization: Bearer KEY``
(401 in the JSON shape otherwise); the SDK and the ``openai`` client send it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from sglang_omni.client import Client, OmniClientError
from sglang_omni.serve.protocol.auth import ApiKeyAuth
from tests.server import SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.wire.kit import HELLO, HTTP, error_of, post_raw

KEY = "wire-test-key"
GOOD = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--api-key", KEY, "--model-name", "m") as server:
        yield server


@pytest.fixture(scope="module")
def direct() -> Iterator[Server]:
    """The direct pipeline, its key from the environment."""
    with Server(*SCRIPTED_GENERATION, env={"SGLANG_OMNI_API_KEY": KEY}) as server:
        yield server


def assert_401(resp) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    assert error_of(resp)["type"] == "authentication_error"


REQUESTS = [("GET", "/v1/models", None), ("GET", "/metrics", None),
            ("POST", "/generate", {"prompt": "hi"}), ("POST", "/v1/chat/completions", HELLO)]


@pytest.mark.parametrize("method, path, body", REQUESTS)
def test_routes_need_the_key(keyed: Server, method: str, path: str, body: dict | None) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY},
                    {"authorization": f"Basic {KEY}"}):
        assert_401(HTTP.request(method, f"{keyed.url}{path}", json=body, headers=headers))
    resp = HTTP.request(method, f"{keyed.url}{path}", json=body, headers=GOOD)
    assert resp.status_code == 200, resp.text


def test_health_is_open(keyed: Server) -> None:
    assert HTTP.get(f"{keyed.url}/health").status_code == 200


def test_unknown_routes_need_the_key_first(keyed: Server) -> None:
    assert_401(HTTP.get(f"{keyed.url}/nothing"))
    assert HTTP.get(f"{keyed.url}/nothing", headers=GOOD).status_code == 404


def test_a_streamed_request_needs_the_key(keyed: Server) -> None:
    assert_401(HTTP.post(f"{keyed.url}/generate", json={"prompt": "hi", "stream": True}))
    with HTTP.stream("POST", f"{keyed.url}/generate", json={"prompt": "hi", "stream": True},
                     headers=GOOD) as resp:
        assert resp.status_code == 200
        assert "[DONE]" in resp.read().decode()


def test_the_sdk_sends_the_key_and_reports_401(keyed: Server) -> None:
    with Client(keyed.url, api_key=KEY, timeout=30) as client:
        assert client.completion(HELLO["messages"]).text
    with Client(keyed.url, timeout=30) as client, pytest.raises(OmniClientError) as info:
        client.completion(HELLO["messages"])
    assert info.value.status == 401 and "api_key" in str(info.value)


def test_the_openai_client_sends_the_key(keyed: Server) -> None:
    good = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(model="m", messages=HELLO["messages"]).choices
    bad = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=HELLO["messages"])


def test_direct_routes_need_the_key(direct: Server) -> None:
    assert HTTP.get(f"{direct.url}/health").status_code == 200
    assert_401(HTTP.get(f"{direct.url}/v1/videos"))
    assert_401(HTTP.post(f"{direct.url}/v1/images/generations", json={"prompt": "a cube"}))
    resp = HTTP.post(f"{direct.url}/v1/images/generations", headers=GOOD,
                     json={"prompt": "a cube", "size": "32x32"})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("body, says", [
    (b'{"prompt": "\\ud800"}', "prompt: the string"),
    (b'{"prompt": "a cube", "model": "\\ud800"}', "model: the string"),
    (b'{"prompt": "a cube", "seed": 18446744073709551616}', "seed: integer"),
    (b'{"prompt": "a cube", "extra_params": "{\\"seed\\": 18446744073709551616}"}',
     "seed: integer"),
])
def test_direct_video_route_refuses_what_the_stage_cannot_carry(direct: Server, body: bytes,
                                                                says: str) -> None:
    resp = post_raw(f"{direct.url}/v1/videos", body, headers=GOOD, timeout=10)
    assert resp.status_code == 400, resp.text
    assert says in error_of(resp)["message"]
    listing = HTTP.get(f"{direct.url}/v1/videos", headers=GOOD)
    assert listing.status_code == 200 and listing.json()["data"] == []


def test_direct_routes_refuse_formats_they_do_not_read(direct: Server) -> None:
    resp = HTTP.post(f"{direct.url}/v1/images/generations", content=b"\x80", headers={
        **GOOD, "content-type": "application/msgpack"})
    assert resp.status_code == 415 and "JSON" in error_of(resp)["message"]
    resp = HTTP.post(f"{direct.url}/v1/videos", content=b"x", headers={
        **GOOD, "content-type": "text/plain"})
    assert resp.status_code == 415
    assert "application/json, multipart/form-data" in error_of(resp)["message"]


def test_a_websocket_without_the_key_is_closed_with_1008() -> None:
    app = FastAPI()
    app.add_middleware(ApiKeyAuth, api_key=KEY)

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        await socket.send_text("hello")
        await socket.close()

    client = TestClient(app)
    with pytest.raises(WebSocketDisconnect) as info, client.websocket_connect("/ws"):
        pass
    assert info.value.code == 1008
    with client.websocket_connect("/ws", headers=GOOD) as socket:
        assert socket.receive_text() == "hello"
