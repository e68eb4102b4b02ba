"""Behaviours that need a server of their own: a generation stage that crashes, and /generate on
a text-only server."""

from __future__ import annotations

import httpx

from tests.server import SCRIPTED_CHAT, Server
from tests.umm.kit import (
    SMALL,
    final,
    image,
    post_generate,
    script,
    stream_generate,
    umm_server,
)


def test_crashing_generation_fails_fast_and_health_turns_503() -> None:
    # no restart budget: the stage stays down (tests/supervision covers restarts)
    with umm_server("--generation.factory.step_time_s", "0",
                    "--generation.factory.max_restarts", "0") as server:
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        resp = post_generate(server, {"prompt": script(image("!crash"), final("never")),
                                      "stage_params": {"generation": SMALL}})
        assert resp.status_code == 500, resp.text
        assert "generation stage process exited" in resp.json()["error"]["message"]
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503
        assert health.json()["stages"]["generation"]["status"] == "exited"
        # later requests are refused at once, streaming or not
        assert post_generate(server, {"prompt": script(final("x"))}).status_code == 503
        status, body = stream_generate(server, {"prompt": script(final("x"))})
        assert status == 503 and body["error"]["code"] == 503


def test_text_only_server_refuses_streaming_generate() -> None:
    with Server(*SCRIPTED_CHAT) as server:
        resp = httpx.post(f"{server.url}/generate", json={"prompt": "hi", "stream": True},
                          timeout=30)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["code"] == 400 and error["type"] == "invalid_request_error"
        assert "stream" in error["message"]
