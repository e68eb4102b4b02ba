"""Direct generation (Cosmos3PipelineConfig) over HTTP with the scripted generator: the native
image, video and action route shapes, refusals before model work, failures, aborts."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import httpx
import pytest

from sglang_omni.engines.synth_media import (
    decode_mp4_frames,
    encode_mp4,
    encode_png,
    frame_pixels,
)
from sglang_omni.media.encode import VideoEncoding
from tests.generation.kit import (
    HTTP,
    cat_media_root,
    error_of,
    metric,
    png_size,
    scripted_server,
    wait_for,
    wait_video,
)
from tests.kit import generation_stops
from tests.server import Server
from tests.supervision.kit import failed_at_exit


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cat_media_root(tmp_path_factory)


@pytest.fixture(scope="module")
def server(media_root: Path):
    with scripted_server("--generation.factory.step_time_s", "0.01",
                         "--allowed-local-media-path", str(media_root),
                         "--model-name", "cosmos3") as srv:
        yield srv


# --- images ------------------------------------------------------------------------------------
def test_image_route_returns_the_png_as_b64_json(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations",
                     json={"prompt": "a red cube", "size": "48x32", "seed": 3})
    assert resp.status_code == 200
    body = resp.json()
    assert body["id"] and isinstance(body["created"], int)
    assert body["inference_time_s"] >= 0
    item = body["data"][0]
    assert item["revised_prompt"] == "a red cube"
    data = base64.b64decode(item["b64_json"])
    assert png_size(data) == (48, 32)
    assert data == encode_png(frame_pixels("a red cube", 3, 48, 32, 0))


def test_image_route_takes_extra_params_and_guardrails(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={
        "prompt": "cube", "extra_params": {"width": 24, "height": 16}, "guardrails": True,
        "response_format": "b64_json", "model": "cosmos3", "n": 1})
    assert resp.status_code == 200
    assert png_size(base64.b64decode(resp.json()["data"][0]["b64_json"])) == (24, 16)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("output_path", "/tmp/x", "output folders"),
    ("n", 2, "exactly one media item"),
    ("response_format", "png", "expected b64_json or url"),
    ("output_format", "jpeg", "PNG"),
    ("width", "wide", "width: expected int"),
    ("num_frames", 5, "not a field of /v1/images/generations"),
    ("size", "big", "WIDTHxHEIGHT"),
])
def test_image_route_refuses_before_model_work(server: Server, field: str, value: object,
                                                says: str) -> None:
    submitted = metric(server, "submitted")
    resp = HTTP.post(f"{server.url}/v1/images/generations",
                     json={"prompt": "cube", field: value})
    assert resp.status_code == 400
    assert error_of(resp)["type"] == "invalid_request_error"
    assert says in error_of(resp)["message"]
    assert metric(server, "submitted") == submitted


def test_image_without_media_is_a_server_error_naming_the_reason(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={"prompt": "!no-media cube"})
    assert resp.status_code == 500
    message = error_of(resp)["message"]
    assert "ended without media" in message and "guardrail block" in message
    assert "generation produced no media" in server.log()  # the generation stage's own log


# --- videos ------------------------------------------------------------------------------------
def test_a_video_job_without_a_size_reports_the_size_it_makes(server: Server) -> None:
    job = HTTP.post(f"{server.url}/v1/videos",
                    json={"prompt": "a wave", "num_frames": 2, "fps": 2}).json()
    assert job["size"] == "640x640"  # the scripted engine's default, not ""
    assert wait_video(server, job["id"])["size"] == "640x640"
    frames = decode_mp4_frames(HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").content)
    assert frames[0].shape[:2] == (640, 640)  # what the job said it makes
    one_side = HTTP.post(f"{server.url}/v1/videos",
                         json={"prompt": "a wave", "width": 320, "num_frames": 2, "fps": 2})
    assert one_side.json()["size"] == "320x640", one_side.text
    wait_video(server, one_side.json()["id"])


def test_video_job_lifecycle(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/videos",
                     json={"prompt": "a wave", "size": "32x32", "num_frames": 5, "fps": 5})
    assert resp.status_code == 200
    job = resp.json()
    assert job["object"] == "video" and job["status"] in ("queued", "in_progress")
    assert job["size"] == "32x32" and job["seconds"] == "1" and job["model"] == "cosmos3"
    done = wait_video(server, job["id"])
    assert done["status"] == "completed" and done["progress"] == 100
    assert done["expires_at"] > done["completed_at"]
    listed = HTTP.get(f"{server.url}/v1/videos").json()
    assert job["id"] in [j["id"] for j in listed["data"]]
    content = HTTP.get(f"{server.url}/v1/videos/{job['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    assert len(decode_mp4_frames(content.content)) == 5
    deleted = HTTP.delete(f"{server.url}/v1/videos/{job['id']}")
    assert deleted.json()["status"] == "deleted"
    assert HTTP.get(f"{server.url}/v1/videos/{job['id']}").status_code == 404
    assert HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").status_code == 404


def test_video_defaults_follow_the_native_route(server: Server) -> None:
    job = HTTP.post(f"{server.url}/v1/videos",
                    json={"prompt": "tiny", "width": 16, "height": 16, "seconds": 1,
                          "fps": 4}).json()
    assert job["seconds"] == "1"
    assert wait_video(server, job["id"])["status"] == "completed"
    data = HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").content
    assert len(decode_mp4_frames(data)) == 4  # num_frames = fps * seconds
    HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


@pytest.mark.parametrize(("body", "says"), [
    ({"action_mode": "policy"}, "/v1/actions/generations"),
    ({"input_reference": "/etc/passwd"}, "input_reference"),
    ({"image_path": "file:///etc/hosts"}, "image_path"),
    ({"video_url": "ftp://example.com/a.mp4"}, "video_url"),
    ({"output_file_name": "x"}, "output folders"),
    ({"seconds": 0}, "seconds"),
    ({"x264_preset": "turbo"}, "x264_preset: expected one of x264's presets"),
    ({"extra_body": {"x264_preset": 3}}, "x264_preset"),
])
def test_video_route_refuses_before_model_work(server: Server, body: dict, says: str) -> None:
    submitted = metric(server, "submitted")
    resp = HTTP.post(f"{server.url}/v1/videos", json={"prompt": "wave", **body})
    assert resp.status_code == 400, resp.text
    assert says in error_of(resp)["message"]
    assert metric(server, "submitted") == submitted


def test_video_route_serves_x264_preset_with_the_server_thread_count(server: Server) -> None:
    """The MP4 is x264 at the request's preset (else the server's) on the configured threads:
    the bytes are exactly what that encoding gives."""
    frames = [frame_pixels("preset", 0, 128, 96, i) for i in range(5)]
    got = {}
    for preset in (None, "ultrafast"):
        body = {"prompt": "preset", "width": 128, "height": 96, "num_frames": 5, "fps": 5}
        job = HTTP.post(f"{server.url}/v1/videos",
                        json={**body, **({"x264_preset": preset} if preset else {})}).json()
        assert wait_video(server, job["id"])["status"] == "completed", job
        got[preset] = HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").content
        HTTP.delete(f"{server.url}/v1/videos/{job['id']}")
    assert got[None] == encode_mp4(frames, 5, encoding=VideoEncoding("medium", 8))
    assert got["ultrafast"] == encode_mp4(frames, 5, encoding=VideoEncoding("ultrafast", 8))
    assert got[None] != got["ultrafast"]


def test_video_reads_allowed_local_media(server: Server, media_root: Path) -> None:
    job = HTTP.post(f"{server.url}/v1/videos", json={
        "prompt": "animate", "input_reference": str(media_root / "cat.png"), "width": 16,
        "height": 16, "num_frames": 2}).json()
    assert wait_video(server, job["id"])["status"] == "completed"
    HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


def test_failed_video_job_carries_the_error(server: Server) -> None:
    job = HTTP.post(f"{server.url}/v1/videos",
                    json={"prompt": "!no-media wave", "num_frames": 2}).json()
    done = wait_video(server, job["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == 500 and "ended without media" in done["error"]["message"]
    content = HTTP.get(f"{server.url}/v1/videos/{job['id']}/content")
    assert content.status_code == 404 and "failed" in error_of(content)["message"]


# --- actions -----------------------------------------------------------------------------------
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


def test_droid_policy_action(server: Server) -> None:
    image = base64.b64encode(encode_png(frame_pixels("obs", 0, 8, 8, 0))).decode()
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick up the cup", "image": {"b64_json": image}},
        "parameters": DROID})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "action.generation" and body["model"] == "cosmos3"
    action = body["data"][0]["action"]
    assert action["shape"] == [16, 8] and len(action["values"]) == 16
    assert all(len(row) == 8 for row in action["values"])
    assert action["raw_action_dim"] == 8 and action["domain_id"] == 8
    assert action["action_mode"] == "policy"
    assert body["usage"]["action_horizon"] == 16 and body["usage"]["action_dim"] == 8


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"input": {"task": "t"}, "parameters": {**DROID, "action_mode": "forward_dynamics"}}, 400,
     "use /v1/videos"),
    ({"input": {"task": "t"}, "parameters": {}}, 400, "domain_name or domain_id"),
    ({"input": {"task": "t", "image": "/etc/passwd"}, "parameters": DROID}, 400,
     "input.image"),
    ({"input": {"observation": {"images": {"wrist": "gopher://x"}}}, "parameters": DROID}, 400,
     "input.observation.images.wrist"),
    ({"input": {"task": "!no-media"}, "parameters": DROID}, 500, "no output"),
])
def test_action_route_refusals_and_failures(server: Server, body: dict, status: int,
                                            says: str) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json=body)
    assert resp.status_code == status, resp.text
    assert says in error_of(resp)["message"]


def test_action_route_reads_json_forms_and_msgpack_only(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations", content=b"\xc1",
                     headers={"content-type": "application/msgpack"})
    assert resp.status_code == 400 and "not valid msgpack" in error_of(resp)["message"]
    resp = HTTP.post(f"{server.url}/v1/actions/generations", content=b"x",
                     headers={"content-type": "text/plain"})
    assert resp.status_code == 415
    assert "application/msgpack" in error_of(resp)["message"]


@pytest.mark.parametrize("field", ["parameters", "input", "extra_body", "anything"])
@pytest.mark.parametrize("levels", [70, 100_000])
def test_action_form_field_nested_too_deep_is_400(server: Server, field: str,
                                                  levels: int) -> None:
    """A form field holding JSON nested past server.max_json_depth is the client's error at any
    depth (100,000 levels broke the JSON decoder's recursion: a 500), naming the field (at 70
    levels the message named the body only)."""
    deep = "[" * levels + "]" * levels
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     data={"prompt": "t", field: deep})
    assert resp.status_code == 400, resp.text
    message = error_of(resp)["message"]
    assert message.startswith(f"{field}: nested deeper than 64 levels"), message
    assert "max_json_depth" in message
    assert "RecursionError" not in server.log()


# --- the routes this pipeline does not serve ---------------------------------------------------
def test_generate_stream_and_chat_are_refused(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/generate", json={"prompt": "hi", "stream": True})
    assert resp.status_code == 400 and "stream" in error_of(resp)["message"]
    resp = HTTP.post(f"{server.url}/v1/chat/completions",
                     json={"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400 and "image, video and action routes" in \
        error_of(resp)["message"]
    models = HTTP.get(f"{server.url}/v1/models").json()["data"][0]
    assert models["pipeline"] == "Cosmos3PipelineConfig"


# --- aborts and a dying stage (own servers) ----------------------------------------------------
STEPS = 200  # 200 steps of 0.25 s: 50 s unless the abort stops the generation


def test_disconnect_stops_the_generation_within_a_step() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/images/generations", timeout=1.5,
                       json={"prompt": "slow", "num_inference_steps": STEPS})
        wait_for(lambda: metric(server, "aborted") == 1, timeout=10)
        wait_for(lambda: bool(generation_stops(server.log())))
        [(_, step)] = generation_stops(server.log())
        assert step < STEPS // 4  # stopped at the step it was in, not at the end
        # the stage is free again: a short generation completes long before the 100 s
        resp = HTTP.post(f"{server.url}/v1/images/generations",
                         json={"prompt": "quick", "num_inference_steps": 1}, timeout=30)
        assert resp.status_code == 200
        assert metric(server, "completed") == 1


def test_deleting_a_running_video_aborts_it() -> None:
    with scripted_server("--generation.factory.step_time_s", "0.25") as server:
        job = HTTP.post(f"{server.url}/v1/videos",
                        json={"prompt": "slow", "num_inference_steps": STEPS}).json()
        wait_for(lambda: HTTP.get(f"{server.url}/v1/videos/{job['id']}").json()["progress"] > 0)
        assert HTTP.delete(f"{server.url}/v1/videos/{job['id']}").status_code == 200
        wait_for(lambda: metric(server, "aborted") == 1, timeout=10)
        assert "generation cancelled at step" in server.log()
        assert metric(server, "completed") == 0


def test_stage_death_fails_the_request_promptly() -> None:
    """With restarts off, a dead stage leaves the server unhealthy (restarts: tests/supervision)."""
    with scripted_server("--generation.factory.max_restarts", "0") as server:
        result: dict = {}

        def client() -> None:
            result["resp"] = httpx.post(f"{server.url}/v1/images/generations", timeout=30,
                                        json={"prompt": "!crash now"})

        thread = threading.Thread(target=client)
        thread.start()
        thread.join(30)
        assert result["resp"].status_code == 500
        assert failed_at_exit(server, "generation", 0) == [1]  # failed with the exit itself
        assert "generation stage process exited" in error_of(result["resp"])["message"]
        health = HTTP.get(f"{server.url}/health")
        assert health.status_code == 503
        assert json.loads(health.text)["stages"]["generation"]["status"] == "exited"
