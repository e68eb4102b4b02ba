"""Direct generation routes over HTTP (scripted generation server): generation limits before any
work, action-route field types and media, video jobs that always serialize, and no engine
exception text in answers."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from sglang_omni.media.encode import encode_mp4
from tests.generation.kit import HTTP, error_of, metric, scripted_server, wait_video
from tests.server import Server

DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}
HUGE = "!size=100000000000000000000"  # the scripted generator fails with an OverflowError

#: A real two-frame MP4 (admission parses inline media: container and first frame).
MP4_CLIP = "data:video/mp4;base64," + base64.b64encode(
    encode_mp4([np.full((16, 16, 3), 80, np.uint8)] * 2, 2)).decode()


@pytest.fixture(scope="module")
def server():
    with scripted_server("--model-name", "cosmos3") as srv:
        yield srv


def refused_before_work(server: Server, route: str, body: dict, *says: str) -> str:
    submitted = metric(server, "submitted")
    resp = HTTP.post(f"{server.url}{route}", json=body)
    assert resp.status_code == 400, resp.text
    message = error_of(resp)["message"]
    for part in says:
        assert part in message, message
    assert metric(server, "submitted") == submitted
    return message


@pytest.mark.parametrize(("body", "says"), [
    ({"size": "16384x16384"}, ("width x height", "server.max_pixels", "--server.max_pixels")),
    ({"width": 16384, "height": 16384}, ("16384x16384", "server.max_pixels")),
    ({"size": "3264x16"}, ("aspect ratio", "server.max_aspect_ratio")),
    ({"num_inference_steps": 201}, ("num_inference_steps", "server.max_inference_steps")),
])
def test_image_route_limits(server: Server, body: dict, says: tuple[str, ...]) -> None:
    refused_before_work(server, "/v1/images/generations", {"prompt": "cube", **body}, *says)


def test_a_side_left_out_counts_as_the_backends_default(server: Server) -> None:
    """The scripted backend's 640, not native's 1280x720, fills in the side left out."""
    for route, body in (("/v1/images/generations", {"prompt": "cube", "width": 3300}),
                        ("/v1/videos", {"prompt": "wave", "height": 3300, "num_frames": 5})):
        refused_before_work(server, route, body, "640x3300" if "height" in body
                            else "3300x640", "server.max_pixels")


@pytest.mark.parametrize(("body", "says"), [
    ({"width": 16384, "height": 16384}, ("server.max_pixels",)),
    ({"num_frames": 258}, ("num_frames", "server.max_frames")),
    ({"seconds": 100}, ("2400 frames", "server.max_frames")),
    ({"num_frames": 40, "fps": 1}, ("40 s of video", "server.max_video_seconds")),
    ({"model": 5}, ("model: expected a string",)),
    ({"num_frames": 5, "fps": 2**31}, ("fps: 2147483648 frames per second", "at most 240")),
    ({"num_frames": 5, "fps": 2**63}, ("fps:", "at most 240")),
    ({"action_mode": "forward_dynamics", "raw_action_dim": 2**62, "action_horizon": 4},
     ("raw_action_dim: expected 1 to 64",)),
])
def test_video_route_limits_and_fields(server: Server, body: dict, says: tuple[str, ...]) -> None:
    refused_before_work(server, "/v1/videos", {"prompt": "wave", **body}, *says)


@pytest.mark.parametrize(("body", "says"), [
    ({"input": {"task": "t"}, "parameters": {**DROID, "raw_action_dim": "a"}},
     "parameters.raw_action_dim: expected an integer, got 'a'"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "action_horizon": "16"}},
     "parameters.action_horizon"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "fps": None}}, "parameters.fps"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "guidance_scale": "x"}},
     "parameters.guidance_scale"),
    ({"input": {"task": 5}, "parameters": DROID}, "input.task"),
    ({"input": "t", "parameters": DROID}, "input: expected an object"),
    ({"input": {"task": "t"}, "parameters": [1]}, "parameters: expected an object"),
    ({"task": "t", **DROID, "domain_id": 1.5}, "domain_id"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "width": 16384, "height": 16384}},
     "server.max_pixels"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "action_horizon": 400}},
     "server.max_frames"),
    ({"task": "t", "domain_name": "droid_lerobot", "raw_action_dim": 2**62},
     "raw_action_dim must be in [1, 64], got 4611686018427387904"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "raw_action_dim": 65}},
     "raw_action_dim must be in [1, 64]"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "action_horizon": 6}},
     "action_horizon must be divisible by 4"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "fps": 2**40}}, "at most 240"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "num_frames": 10}}, "divisible by 4"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "num_frames": 9, "action_horizon": 4}},
     "num_frames == action_horizon + 1"),
    ({"input": {"task": "t"}, "parameters": {**DROID, "num_frames": 1}},
     "num_frames must be greater than 1"),
    # the limits check the fields native runs: input.observation, not input's own or the body's
    ({"num_inference_steps": 5, "input": {"task": "t", "num_inference_steps": 10,
                                          "observation": {**DROID, "num_inference_steps": 9000}}},
     "server.max_inference_steps"),
])
def test_action_route_field_types_and_limits(server: Server, body: dict, says: str) -> None:
    refused_before_work(server, "/v1/actions/generations", body, says)


@pytest.mark.parametrize(("body", "says"), [
    ({"input": {"task": "t", "video": {"url": "gopher://x/a.mp4"}}, "parameters": DROID},
     "input.video.url"),
    ({"input": {"task": "t", "images": ["/etc/passwd"]}, "parameters": DROID},
     "input.images: expected an object"),
    ({"input": {"task": "t", "image": {"url": "/etc/passwd"}}, "parameters": DROID},
     "input.image.url"),
    ({"input": {"task": "t", "image": ["/etc/passwd"]}, "parameters": DROID}, "input.image"),
    ({"input": {"task": "t", "video": {"path": "/etc/passwd"}}, "parameters": DROID},
     "input.video"),
    ({"input": {"task": "t", "observation": {"images": {"w": {"b64_json": 3}}}},
      "parameters": DROID}, "input.observation.images.w.b64_json"),
])
def test_action_route_media_shapes_pass_the_policy(server: Server, body: dict,
                                                   says: str) -> None:
    refused_before_work(server, "/v1/actions/generations", body, says)


def test_a_null_horizon_is_the_default(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     json={"input": {"task": "t"}, "parameters": {**DROID,
                                                                 "action_horizon": None}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"][0]["action"]["shape"] == [16, 8]


def test_engine_exception_text_never_reaches_the_client(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={"prompt": HUGE})
    assert resp.status_code == 500
    message = error_of(resp)["message"]
    assert "index-sized" not in message and "Overflow" not in message
    assert "log" in message
    assert "cannot fit 'int' into an index-sized integer" in server.log()  # logged, with detail
    job = HTTP.post(f"{server.url}/v1/videos", json={"prompt": HUGE, "num_frames": 2}).json()
    failed = wait_video(server, job["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == 500
    assert "index-sized" not in json.dumps(failed)
    HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


def test_video_jobs_always_serialize(server: Server) -> None:
    raw = b'{"prompt": "wave", "num_frames": 2, "model": "\\ud800"}'
    resp = HTTP.post(f"{server.url}/v1/videos", content=raw,
                     headers={"content-type": "application/json"})
    assert resp.status_code in (200, 400), resp.text
    assert "error" in resp.json() or resp.json()["object"] == "video"
    listed = HTTP.get(f"{server.url}/v1/videos")
    assert listed.status_code == 200 and listed.json()["object"] == "list"
    if resp.status_code == 200:
        video_id = resp.json()["id"]
        assert HTTP.get(f"{server.url}/v1/videos/{video_id}").status_code == 200
        wait_video(server, video_id)
        assert HTTP.get(f"{server.url}/v1/videos").status_code == 200
        assert HTTP.delete(f"{server.url}/v1/videos/{video_id}").status_code == 200


def test_a_valid_action_still_runs(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick", "video": {"url": MP4_CLIP}},
        "parameters": {**DROID, "action_mode": "inverse_dynamics"}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"][0]["action"]["shape"] == [16, 8]


def test_an_action_runs_the_fields_native_reads(server: Server) -> None:
    """With ``input``, native reads ``input.observation`` (and the prompt and media of
    ``input``), then ``parameters``: the body's own fields are not read, so they neither run
    nor slip past the limits."""
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "num_inference_steps": 5000, "action_horizon": 8,
        "input": {"task": "pick", "num_inference_steps": 7, "observation": {"seed": 3}},
        "parameters": DROID})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["usage"]["denoise_steps"] == 4  # the engine's default
    assert answer["data"][0]["action"]["shape"] == [16, 8]  # the default horizon
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick", "observation": {"num_inference_steps": 3}},
        "parameters": {**DROID, "num_inference_steps": 2}})
    assert resp.json()["usage"]["denoise_steps"] == 2  # parameters win


def test_the_action_horizon_follows_num_frames_and_the_prompt_the_observation(
        server: Server) -> None:
    """As native: without ``action_horizon`` the horizon is ``num_frames`` - 1, and the prompt
    is the observation's (``parameters.prompt`` is not read: the scripted engine would fail
    the job on its ``!no-media`` directive)."""
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick"}, "parameters": {**DROID, "num_frames": 9,
                                                  "prompt": "!no-media"}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"][0]["action"]["shape"] == [8, 8]


def test_action_route_counts_media_against_the_request_limit() -> None:
    with scripted_server("--server.max_media_parts", "1") as srv:
        clip = MP4_CLIP
        refused_before_work(srv, "/v1/actions/generations", {
            "input": {"task": "pick", "video": clip, "observation": {"video": clip}},
            "parameters": {**DROID, "action_mode": "inverse_dynamics"}},
            "2 media references", "--server.max_media_parts 1")
