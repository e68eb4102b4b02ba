"""The interleaved routes over HTTP (scripted UMM server): SSE keep-alive comments during a slow
generation, Retry-After on 503, and the generation limits before the Reasoner's first turn."""

from __future__ import annotations

import pytest

from sglang_omni.errors import ServiceUnavailable, StageRestarting
from sglang_omni.serve.wire.http_errors import error_response
from tests.server import Server
from tests.umm.kit import HTTP, final, image, metric, post_chat, post_generate, script, umm_server

RETRY_AFTER = 7


@pytest.fixture(scope="module")
def server():
    with umm_server("--server.sse_keepalive_s", "0.2", "--server.retry_after_s",
                    str(RETRY_AFTER), "--orchestrator.factory.max_active", "1",
                    "--generation.factory.step_time_s", "0.1") as srv:
        yield srv


SLOW_IMAGE = {"messages": [{"role": "user", "content": script(image("a cube"), final("done"))}],
              "stage_params": {"generation": {"width": 32, "height": 32,
                                              "num_inference_steps": 10}}}


def test_sse_sends_keepalive_comments_during_a_slow_generation(server: Server) -> None:
    with HTTP.stream("POST", f"{server.url}/generate", json={**SLOW_IMAGE, "stream": True}) \
            as resp:
        assert resp.status_code == 200
        assert resp.headers["cache-control"] == "no-cache"
        raw = resp.read().decode()
    assert raw.count(": keep-alive\n\n") >= 2, raw[:300]  # 1 s of steps, one every 0.2 s
    assert raw.endswith("data: [DONE]\n\n") and "event: complete" in raw
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**SLOW_IMAGE, "stream": True,
                           "stream_options": {"include_usage": True}}) as resp:
        raw = resp.read().decode()
    assert ": keep-alive\n\n" in raw and raw.endswith("data: [DONE]\n\n")
    assert '"total_tokens"' in raw and '"error"' not in raw


def test_every_503_carries_retry_after(server: Server) -> None:
    assert error_response(StageRestarting("restarting"), 3).headers["retry-after"] == "3"
    assert error_response(ServiceUnavailable("busy")).headers["retry-after"]
    # A streaming request answers 200 once admitted, so it holds the only slot while it runs.
    with HTTP.stream("POST", f"{server.url}/generate", json={**SLOW_IMAGE, "stream": True}) \
            as held:
        assert held.status_code == 200
        resp = post_generate(server, {"prompt": script(final("x"))})
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == str(RETRY_AFTER)
        assert resp.json()["error"]["type"] == "service_unavailable"
        assert held.read().decode().endswith("data: [DONE]\n\n")


def test_a_side_left_out_counts_as_the_backends_default(server: Server) -> None:
    """The scripted backend makes 640x640 when a side is left out (never native's 1280x720):
    3200 wide fits server.max_pixels beside a 640 height, 3300 does not."""
    body = {"messages": [{"role": "user", "content": script(final("x"))}]}
    for post in (post_generate, post_chat):
        fits = post(server, {**body, "stage_params": {"generation": {"width": 3200}}})
        assert fits.status_code == 200, fits.text
        over = post(server, {**body, "stage_params": {"generation": {"width": 3300}}})
        assert over.status_code == 400, over.text
        assert "3300x640 is 2112000 pixels" in over.json()["error"]["message"]


@pytest.mark.parametrize(("options", "says"), [
    ({"width": 16384, "height": 16384}, ("stage_params.generation.width", "server.max_pixels",
                                         "--server.max_pixels")),
    ({"width": 3264, "height": 16}, ("aspect ratio", "--server.max_aspect_ratio")),
    ({"num_inference_steps": 1000}, ("stage_params.generation.num_inference_steps",
                                     "server.max_inference_steps")),
    ({"num_frames": 100000}, ("stage_params.generation.num_frames", "server.max_frames")),
    ({"num_frames": 200, "fps": 2}, ("100 s of video", "server.max_video_seconds")),
    ({"fps": 2**63}, ("stage_params.generation.fps: 9223372036854775808", "at most 240")),
    ({"raw_action_dim": 2**62}, ("stage_params.generation.raw_action_dim: expected 1 to 64",)),
    ({"width": -16, "height": 16}, ("stage_params.generation.width: expected a positive",)),
    ({"width": 16, "height": 16, "num_frames": -5, "fps": 1},
     ("stage_params.generation.num_frames: expected a positive",)),
])
def test_generation_limits_before_the_first_turn(server: Server, options: dict,
                                                 says: tuple[str, ...]) -> None:
    turns = metric(server, "reasoner", "submitted")
    body = {"messages": [{"role": "user", "content": script(final("x"))}],
            "stage_params": {"generation": options}}
    for resp in (post_generate(server, body), post_chat(server, body)):
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        for part in says:
            assert part in message, message
    assert metric(server, "reasoner", "submitted") == turns
