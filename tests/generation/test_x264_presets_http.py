"""Slow x264 presets over HTTP (scripted engines, real servers): a request may name only the
server's ``server.allowed_x264_presets`` (400 naming the field and the allowed presets on every
route that takes one, before any model work), and an encode allowed to be long reports progress
all along, so its stage is never taken for hung (issue 33: one placebo video took the generation
stage down, and four rounds the server for good)."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import pytest
from websockets.sync.client import connect

from sglang_omni.config.server import DEFAULT_ALLOWED_X264_PRESETS
from sglang_omni.engines.synth_media import encode_png, frame_pixels
from tests import kit
from tests.generation.kit import HTTP, error_of, metric, scripted_server, wait_video
from tests.server import Server
from tests.supervision.kit import restarts
from tests.umm.kit import final, post_generate, script, umm_server, video

ALLOWED = ", ".join(DEFAULT_ALLOWED_X264_PRESETS)
#: issue 33's request, as the attacker sent it
ATTACK = {"prompt": "a cube", "size": "1280x720", "num_frames": 121, "fps": 24,
          "num_inference_steps": 1, "x264_preset": "placebo"}
PNG = encode_png(frame_pixels("cat", 0, 8, 8, 0))
FORWARD = {"input": {"task": "push", "image": {"b64_json": base64.b64encode(PNG).decode()}},
           "parameters": {"domain_name": "droid_lerobot", "action_mode": "forward_dynamics",
                          "action": [[0.0] * 8] * 4, "x264_preset": "placebo"}}


@pytest.fixture(scope="module")
def server():
    with scripted_server() as srv:
        yield srv


def refused(resp: Any, where: str = "x264_preset") -> None:
    assert resp.status_code == 400, resp.text
    message = error_of(resp)["message"]
    assert f"{where}: 'placebo' is not allowed on this server; allowed: {ALLOWED} " \
           "(server.allowed_x264_presets)" in message, message


def health_ok(server: Server) -> None:
    resp = HTTP.get(f"{server.url}/health")
    assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text


def x264_enums(node: Any) -> list[list[str]]:
    """The ``enum`` of every ``x264_preset`` property in an OpenAPI document."""
    if isinstance(node, list):
        return [e for item in node for e in x264_enums(item)]
    if not isinstance(node, dict):
        return []
    props = node.get("properties")
    found = [props["x264_preset"]["enum"]] if isinstance(props, dict) and \
        "x264_preset" in props else []
    return found + [e for value in node.values() for e in x264_enums(value)]


def test_the_openapi_schema_lists_only_the_allowed_presets(server: Server) -> None:
    """/openapi.json offers what the server takes: server.allowed_x264_presets, not placebo."""
    schema = HTTP.get(f"{server.url}/openapi.json").json()
    enums = x264_enums(schema)
    assert enums, "the video request schema names x264_preset"
    assert all(enum == list(DEFAULT_ALLOWED_X264_PRESETS) for enum in enums), enums


def test_the_openapi_schema_follows_the_setting() -> None:
    from sglang_omni.config.server import ServerSettings
    from sglang_omni.serve.schemas.server_openapi import narrow_to_settings

    schema = {"components": {"schemas": {"Video": {"properties": {
        "x264_preset": {"enum": ["ultrafast", "placebo"]}, "fps": {"type": "number"}}}}}}
    narrowed = narrow_to_settings(schema, ServerSettings(allowed_x264_presets=("medium",)))
    assert x264_enums(narrowed) == [["medium"]]
    assert "server.allowed_x264_presets" in \
        narrowed["components"]["schemas"]["Video"]["properties"]["x264_preset"]["description"]


def test_the_attackers_video_ten_times_in_a_row_is_refused_and_health_stays_ok(
        server: Server) -> None:
    for _ in range(10):
        refused(HTTP.post(f"{server.url}/v1/videos", json=ATTACK))
        health_ok(server)
    assert metric(server, "submitted") == 0  # refused before any model work
    assert restarts(server, "generation") == 0


@pytest.mark.parametrize("body", [
    {"extra_body": {"x264_preset": "placebo"}},
    {"extra_params": '{"x264_preset": "placebo"}'},
])
def test_the_preset_inside_extra_options_is_refused_too(server: Server, body: dict) -> None:
    plain = {k: v for k, v in ATTACK.items() if k != "x264_preset"}
    resp = HTTP.post(f"{server.url}/v1/videos", json={**plain, **body})
    refused(resp)


def test_a_video_form_is_refused_too(server: Server) -> None:
    form = {k: str(v) for k, v in ATTACK.items()}
    refused(HTTP.post(f"{server.url}/v1/videos", data=form,
                      files={"input_reference": ("cat.png", PNG, "image/png")}))


def test_the_action_route_refuses_it(server: Server) -> None:
    before = metric(server, "submitted")
    refused(HTTP.post(f"{server.url}/v1/actions/generations", json=FORWARD))
    assert metric(server, "submitted") == before


def test_the_realtime_routes_refuse_it(server: Server) -> None:
    base = server.url.replace("http", "ws")
    with connect(base + "/v1/actions/realtime", open_timeout=10) as conn:
        conn.recv(timeout=30)  # the metadata
        conn.send(msgpack.packb(FORWARD))
        error = msgpack.unpackb(conn.recv(timeout=30), raw=False)
        assert error["code"] == 400
        assert f"'placebo' is not allowed on this server; allowed: {ALLOWED}" in error["error"]
    with connect(base + "/v1/realtime_video/generate", open_timeout=10) as conn:
        conn.send(msgpack.packb({"type": "init", "prompt": "sea", "size": "32x32",
                                 "num_frames": 3, "x264_preset": "placebo"}))
        error = msgpack.unpackb(conn.recv(timeout=30), raw=False)
        assert error["type"] == "error"
        assert f"x264_preset: 'placebo' is not allowed on this server; allowed: {ALLOWED}" \
            in error["error"]["message"], error
    health_ok(server)


def test_generate_refuses_it_in_stage_params_before_the_reasoner_runs() -> None:
    with umm_server() as umm:
        body = {"messages": [{"role": "user", "content": script(video("a cube"), final("done"))}],
                "stage_params": {"generation": {"x264_preset": "placebo"}}}
        for _ in range(3):
            refused(post_generate(umm, body), "stage_params.generation.x264_preset")
            health_ok(umm)
        assert kit.metric(umm, "reasoner", "submitted", default=0) == 0
        allowed = {**body, "stage_params": {"generation": {"x264_preset": "ultrafast",
                                                           "width": 32, "height": 32,
                                                           "num_frames": 3}}}
        assert post_generate(umm, allowed).status_code == 200


PROGRESS_S = 15


@pytest.mark.timeout(600)  # the encode alone takes minutes beside other work: its own bound
def test_a_long_encode_is_not_taken_for_a_hung_engine() -> None:
    """An encode of several times the stage's progress timeout (x264's slowest preset, one
    thread, 160 frames of 512x512: 29 s on an idle core; the timeout lowered to 15 s, which a
    loaded machine's late heartbeats leave alone: at 8 s one packet of a loaded machine took
    longer) completes: the encoder reports each frame and packet, so the stage
    is neither judged hung nor restarted. (Under the suite's 120 s a loaded machine's encode
    outlasted the test, and pytest-timeout ended its xdist worker.)"""
    with scripted_server("--server.allowed_x264_presets", "[medium, placebo]",
                         "--generation.factory.x264_threads", "1",
                         "--generation.factory.progress_timeout_s", str(PROGRESS_S),
                         "--generation.factory.heartbeat_interval_s", "0.2") as srv:
        job = HTTP.post(f"{srv.url}/v1/videos", json={
            "prompt": "a slow cube", "width": 512, "height": 512, "num_frames": 160, "fps": 24,
            "num_inference_steps": 1, "x264_preset": "placebo"}).json()
        done = wait_video(srv, job["id"], timeout=600)
        assert done["status"] == "completed", done.get("error")
        # the job outlasted the progress timeout (load only makes it longer)
        assert done["completed_at"] - done["created_at"] > PROGRESS_S, done
        content = HTTP.get(f"{srv.url}/v1/videos/{job['id']}/content")
        assert content.status_code == 200 and content.content[4:8] == b"ftyp"
        health = HTTP.get(f"{srv.url}/health").json()
        assert health["status"] == "ok", health
        assert health["stages"]["generation"]["restarts"] == 0
        assert health["stages"]["generation"]["last_fault"] is None
        assert restarts(srv, "generation") == 0
        assert "made no progress" not in srv.log()
