"""The native routes' other body formats and routes over HTTP (scripted generation): image
``url`` answers and their content, image edits (forms), video forms, action forms and msgpack,
the action metadata, ``/server_info`` and ``/model_info``. Every upload and reference passes the
media policy before any work."""

from __future__ import annotations

import base64
from pathlib import Path

import msgpack
import numpy as np
import pytest

from sglang_omni.engines.synth_media import decode_mp4_frames, encode_png, frame_pixels
from sglang_omni.media.encode import encode_mp4
from tests.generation.kit import (
    CAT_PNG,
    HTTP,
    cat_media_root,
    error_of,
    metric,
    png_size,
    scripted_server,
    wait_video,
)
from tests.server import Server

PNG = CAT_PNG
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}
MSGPACK = {"content-type": "application/msgpack"}


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cat_media_root(tmp_path_factory)


@pytest.fixture(scope="module")
def server(media_root: Path):
    # inline media up to 4 KiB per request: the 90-byte PNG passes, 5000 bytes do not; JSON
    # nested at most 16 deep (the default is 64)
    with scripted_server("--generation.factory.step_time_s", "0.01", "--model-name", "cosmos3",
                         "--server.max_media_bytes", "4096", "--server.max_json_depth", "16",
                         "--allowed-local-media-path", str(media_root)) as srv:
        yield srv


def refused(server: Server, route: str, **kwargs: object) -> str:
    """The 400 message of a request refused before any work."""
    submitted = metric(server, "submitted")
    resp = HTTP.post(f"{server.url}{route}", **kwargs)  # type: ignore[arg-type]
    assert resp.status_code == 400, resp.text
    assert metric(server, "submitted") == submitted
    return str(error_of(resp)["message"])


# --- images ------------------------------------------------------------------------------------
def test_url_answers_are_served_from_memory(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations",
                     json={"prompt": "a red cube", "size": "40x24", "response_format": "url"})
    assert resp.status_code == 200, resp.text
    item = resp.json()["data"][0]
    assert set(item) == {"url", "revised_prompt"}
    assert item["url"] == f"/v1/images/{resp.json()['id']}/content"
    content = HTTP.get(f"{server.url}{item['url']}")
    assert content.status_code == 200 and content.headers["content-type"] == "image/png"
    assert content.content == encode_png(frame_pixels("a red cube", 0, 40, 24, 0))
    assert HTTP.get(f"{server.url}{item['url']}?variant=0").status_code == 200
    assert HTTP.get(f"{server.url}{item['url']}?variant=1").status_code == 404


def test_b64_answers_are_not_held(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={"prompt": "x", "size": "8x8"})
    content = HTTP.get(f"{server.url}/v1/images/{resp.json()['id']}/content")
    assert content.status_code == 404 and "response_format url" in error_of(content)["message"]


def test_edit_takes_an_uploaded_image(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/edits",
                     data={"prompt": "a cat in a hat", "size": "24x16", "seed": "4"},
                     files={"image": ("cat.png", PNG, "image/png")})
    assert resp.status_code == 200, resp.text
    data = base64.b64decode(resp.json()["data"][0]["b64_json"])
    assert data == encode_png(frame_pixels("a cat in a hat", 4, 24, 16, 0))


def test_edit_takes_a_reference_as_a_form_or_json(server: Server, media_root: Path) -> None:
    form = HTTP.post(f"{server.url}/v1/images/edits", data={
        "prompt": "cat", "url": str(media_root / "cat.png"), "response_format": "url",
        "size": "8x8"})
    assert form.status_code == 200, form.text
    assert HTTP.get(f"{server.url}{form.json()['data'][0]['url']}").status_code == 200
    inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
    for url in ([inline], inline):
        json = HTTP.post(f"{server.url}/v1/images/edits", json={"prompt": "cat", "url": url,
                                                                "size": "8x8"})
        assert json.status_code == 200, json.text


@pytest.mark.parametrize(("data", "files", "says"), [
    ({"prompt": "cat"}, None, "image: required"),
    ({"prompt": "cat", "url": "/etc/passwd"}, None, "url[0]"),
    ({"prompt": "cat", "url": "http://127.0.0.1/a.png"}, None, "loopback"),
    ({"prompt": "cat"}, [("image", ("a.png", PNG, "image/png")),
                         ("image", ("b.png", PNG, "image/png"))], "one image"),
    ({"prompt": "cat"}, {"image": ("big.png", b"\x89PNG" + bytes(5000), "image/png")},
     "max_media_bytes"),
    ({"prompt": "cat"}, {"image": ("a.png", PNG, "image/png"),
                         "mask": ("m.png", PNG, "image/png")}, "mask"),
    ({"prompt": "cat", "num_frames": "3"}, {"image": ("a.png", PNG, "image/png")},
     "num_frames"),
    ({"prompt": "cat", "seed": "x"}, {"image": ("a.png", PNG, "image/png")},
     "seed: expected an integer"),
    ({"prompt": "cat", "style": "vivid"}, {"image": ("a.png", PNG, "image/png")},
     "not a field of /v1/images/edits"),
])
def test_edit_refusals_come_before_any_work(server: Server, data: dict, files: object,
                                            says: str) -> None:
    assert says in refused(server, "/v1/images/edits", data=data, files=files)


# --- videos ------------------------------------------------------------------------------------
def test_video_form_with_an_uploaded_reference(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/videos", data={
        "prompt": "a wave", "size": "32x32", "num_frames": "3", "fps": "3",
        "extra_params": '{"seed": 2}'}, files={"input_reference": ("cat.png", PNG, "image/png")})
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["object"] == "video" and job["size"] == "32x32" and job["seconds"] == "1"
    assert wait_video(server, job["id"])["status"] == "completed"
    video = HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").content
    frames = decode_mp4_frames(video)
    assert len(frames) == 3 and frames[0].shape == (32, 32, 3)
    HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


def test_video_reference_upload_and_urlencoded_forms(server: Server) -> None:
    clip = encode_mp4([np.full((16, 16, 3), 80, np.uint8)] * 2, 2)  # parsed at admission
    resp = HTTP.post(f"{server.url}/v1/videos", data={"prompt": "more", "num_frames": "2"},
                     files={"video_reference": ("clip.mp4", clip, "video/mp4")})
    assert resp.status_code == 200, resp.text
    assert wait_video(server, resp.json()["id"])["status"] == "completed"
    plain = HTTP.post(f"{server.url}/v1/videos", data={"prompt": "calm", "num_frames": "2",
                                                       "width": "16", "height": "16"})
    assert plain.status_code == 200 and plain.json()["size"] == "16x16"
    for job in (resp.json(), plain.json()):
        wait_video(server, job["id"])
        HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


@pytest.mark.parametrize(("data", "files", "says"), [
    ({"num_frames": "2"}, None, "prompt: required"),
    ({"prompt": "w", "num_frames": "two"}, None, "num_frames: expected an integer"),
    ({"prompt": "w", "reference_url": "file:///etc/hosts"}, None, "reference_url"),
    ({"prompt": "w"}, {"input_reference": ("big.png", bytes(5000), "image/png")},
     "max_media_bytes"),
    ({"prompt": "w", "output_path": "/tmp"}, None, "output folders"),
    ({"prompt": "w", "extra_body": "{oops"}, None, "extra_body: expected a JSON object"),
])
def test_video_form_refusals_come_before_any_work(server: Server, data: dict, files: object,
                                                  says: str) -> None:
    assert says in refused(server, "/v1/videos", data=data, files=files)


@pytest.mark.parametrize("route", ["/v1/images/generations", "/v1/videos"])
@pytest.mark.parametrize("container", ["extra_params", "extra_body"])
def test_extra_fields_as_json_text_take_the_servers_depth_limit(server: Server, route: str,
                                                                container: str) -> None:
    """``extra_params``/``extra_body`` sent as JSON text were parsed with the default
    ``max_json_depth`` (64), whatever the server's was."""
    deep = "[" * 20 + "]" * 20
    says = refused(server, route, json={"prompt": "w", container: f'{{"seed": {deep}}}'})
    assert says.startswith(f"{container}: "), says
    assert "nested deeper than 16 levels (server.max_json_depth)" in says, says


# --- actions -----------------------------------------------------------------------------------
def observation() -> dict:
    return {"b64_json": base64.b64encode(PNG).decode()}


def test_action_form_arranged_as_native(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     data={"prompt": "pick up the cup", "domain_name": "droid_lerobot",
                           "raw_action_dim": "8", "extra_params": '{"seed": 3}'},
                     files={"image_reference": ("obs.png", PNG, "image/png")})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "action.generation" and body["model"] == "cosmos3"
    assert body["data"][0]["action"]["shape"] == [16, 8]
    same = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick up the cup", "image": observation()},
        "parameters": {**DROID, "seed": 3}}).json()
    assert same["data"][0]["action"]["values"] == body["data"][0]["action"]["values"]


def test_action_msgpack_answers_with_native_arrays(server: Server) -> None:
    request = {"input": {"task": "open", "image": observation()}, "parameters": DROID}
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     content=msgpack.packb(request), headers=MSGPACK)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/msgpack"
    answer = msgpack.unpackb(resp.content, raw=False, strict_map_key=False)
    values = answer["data"][0]["action"]["values"]
    assert values[b"__ndarray__"] is True and values[b"dtype"] == "<f4"
    array = np.frombuffer(values[b"data"], np.float32).reshape(values[b"shape"])
    as_json = HTTP.post(f"{server.url}/v1/actions/generations", json=request).json()
    assert np.allclose(array, as_json["data"][0]["action"]["values"])
    accept = HTTP.post(f"{server.url}/v1/actions/generations", json=request,
                       headers={"accept": "application/msgpack"})
    assert accept.headers["content-type"] == "application/msgpack"


def test_action_msgpack_numpy_observation(server: Server) -> None:
    pixels = np.zeros((8, 8, 3), np.uint8)
    image = {b"__ndarray__": True, b"data": pixels.tobytes(), b"dtype": "|u1",
             b"shape": [8, 8, 3]}
    request = {"input": {"task": "t", "observation": {"image": image}}, "parameters": DROID}
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     content=msgpack.packb(request, use_bin_type=True), headers=MSGPACK)
    assert resp.status_code == 200, resp.text
    bad = {**request, "input": {"task": "t", "image": {**image, b"shape": [9, 8, 3]}}}
    says = refused(server, "/v1/actions/generations",
                   content=msgpack.packb(bad, use_bin_type=True), headers=MSGPACK)
    assert "input.image: shape [9, 8, 3]" in says


def test_action_raw_response_format(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "t", "image": observation()}, "parameters": DROID,
        "runtime": {"response_format": "raw"}})
    assert resp.status_code == 200, resp.text
    raw = resp.json()
    assert len(raw["actions"]) == 16 and raw["raw_action_dim"] == 8 and raw["domain_id"] == 8
    says = refused(server, "/v1/actions/generations", json={
        "input": {"task": "t"}, "parameters": DROID, "runtime": {"response_format": "xml"}})
    assert "runtime.response_format: must be 'envelope' or 'raw'" in says


@pytest.mark.parametrize(("data", "files", "says"), [
    ({"prompt": "t", **DROID}, {"image_reference": ("big.png", bytes(5000), "image/png")},
     "max_media_bytes"),
    ({"prompt": "t", "video_url": "gopher://x/a.mp4", **DROID}, None, "input.observation.video"),
    ({"prompt": "t", "action_horizon": "sixteen", **DROID}, None, "parameters.action_horizon"),
])
def test_action_form_refusals_come_before_any_work(server: Server, data: dict, files: object,
                                                   says: str) -> None:
    data = {k: str(v) for k, v in data.items()}
    assert says in refused(server, "/v1/actions/generations", data=data, files=files)


def test_b64_json_images_count_against_max_media_parts(server: Server) -> None:
    """33 ``{"b64_json": ...}`` images (2.9 KiB together, under this server's 4 KiB of inline
    media) are more media items than ``max_media_parts`` (32) allows: 400 naming the first one
    over the limit, before any work."""
    images = {f"cam{i}": observation() for i in range(33)}
    says = refused(server, "/v1/actions/generations", json={
        "input": {"task": "t", "images": images}, "parameters": DROID})
    assert says.startswith("input.images.cam32.b64_json: the request carries 33 media "), says
    assert "--server.max_media_parts 32" in says


def test_action_metadata(server: Server) -> None:
    meta = HTTP.get(f"{server.url}/v1/actions/metadata").json()
    assert meta["object"] == "action.metadata" and meta["policy_family"] == "cosmos3"
    assert meta["model"] == "cosmos3"
    assert meta["capabilities"]["action_modes"] == ["policy", "inverse_dynamics"]
    assert meta["capabilities"]["realtime_websocket"] is True
    assert meta["defaults"] == {"action_mode": "policy", "action_horizon": 16,
                                "num_inference_steps": 35, "height": 480, "width": 832, "fps": 5}
    assert meta["output"]["action_type"] == "continuous"


# --- server and model info ---------------------------------------------------------------------
def test_server_and_model_info(server: Server) -> None:
    info = HTTP.get(f"{server.url}/server_info").json()
    assert info["served_model_name"] == "cosmos3" and info["version"] == "0.5.23"
    assert info["tp_size"] == 1 and info["dp_size"] == 1 and "model_path" in info
    model = HTTP.get(f"{server.url}/model_info").json()
    assert model["is_generation"] is True and model["model_type"] == "diffusion"
    assert model["task_type"] == "TI2V" and model["architectures"] == ["Cosmos3Pipeline"]


def test_png_size_helper_reads_what_the_edit_made(server: Server) -> None:
    resp = HTTP.post(f"{server.url}/v1/images/edits", data={"prompt": "x", "width": "16",
                                                            "height": "48"},
                     files={"image[]": ("a.png", PNG, "image/png")})
    assert png_size(base64.b64decode(resp.json()["data"][0]["b64_json"])) == (16, 48)
