"""Every error answer is JSON ``{"error": {...}}``: FastAPI's 404/405, and unexpected
exceptions (a generic 500 that leaks no internal text, never plain ``Internal Server Error``)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang_omni.serve.wire.http_errors import error_response, install_error_handlers
from tests.server import Server
from tests.wire.kit import HTTP, error_of


def test_unknown_route_is_404_json(limited: Server) -> None:
    resp = HTTP.get(f"{limited.url}/v2/nothing")
    assert resp.status_code == 404
    assert "/v2/nothing" in error_of(resp)["message"]


def test_wrong_method_is_405_json(limited: Server) -> None:
    resp = HTTP.get(f"{limited.url}/generate")
    assert resp.status_code == 405
    assert "POST" in error_of(resp)["message"] and resp.headers["allow"] == "POST"


def test_an_unexpected_exception_is_a_generic_json_500() -> None:
    app = FastAPI()
    install_error_handlers(app, error_response)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("/secret/internal/path exploded")

    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.get("/boom")
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["code"] == 500 and "logged on the server" in error["message"]
    assert "secret" not in resp.text
