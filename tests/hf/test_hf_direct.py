"""Direct generation on the hf backend (``serve --demo --direct``) over HTTP on a tiny
checkpoint whose transformer has action heads: images (b64, url, an edit), a video job, the
action modes diffusers' Cosmos3 pipeline exposes (policy, inverse dynamics, and forward dynamics
through /v1/videos), and the action metadata."""

from __future__ import annotations

import base64
import io
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("diffusers")

from sglang_omni.engines.synth_media import decode_mp4_frames  # noqa: E402
from sglang_omni.media.encode import encode_mp4, encode_png  # noqa: E402
from sglang_omni.models.cosmos3.action_metadata import has_action_heads  # noqa: E402
from tests.server import Server  # noqa: E402

SMALL = {"width": 64, "height": 64, "num_inference_steps": 2}
DROID = {"domain_name": "droid_lerobot", "action_horizon": 4, "height": 256}


@pytest.fixture(scope="module")
def action_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with seeded action heads added to its transformer."""
    import torch
    from diffusers import Cosmos3OmniTransformer

    root = tmp_path_factory.mktemp("tiny-action") / "cosmos3"
    shutil.copytree(tiny_checkpoint, root)
    base = Cosmos3OmniTransformer.from_pretrained(root / "transformer")
    config = {**base.config, "action_gen": True, "action_dim": 16}
    torch.manual_seed(5)
    with_heads = Cosmos3OmniTransformer.from_config(config)
    with_heads.load_state_dict(base.state_dict(), strict=False)
    shutil.rmtree(root / "transformer")
    with_heads.save_pretrained(root / "transformer")
    return root


@pytest.fixture(scope="module")
def server(action_checkpoint: Path) -> Any:
    with Server("--demo", "--direct", "--model-path", str(action_checkpoint),
                "--model-name", "tiny", timeout=240) as running:
        yield running


def post(server: Server, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", timeout=120, **kwargs)


def frames(count: int, size: int = 64) -> list[Any]:
    import numpy as np

    return [np.full((size, size, 3), 40 * i, np.uint8) for i in range(count)]


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def wait_video(server: Server, video_id: str) -> dict[str, Any]:
    for _ in range(600):
        job = httpx.get(f"{server.url}/v1/videos/{video_id}").json()
        if job["status"] in ("completed", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"video {video_id} did not finish")


def test_images_and_an_edit(server: Server) -> None:
    from PIL import Image

    b64 = post(server, "/v1/images/generations", json={"prompt": "a red cube", "seed": 3,
                                                         **SMALL})
    assert b64.status_code == 200, b64.text
    image = base64.b64decode(b64.json()["data"][0]["b64_json"])
    assert Image.open(io.BytesIO(image)).size == (64, 64)
    url = post(server, "/v1/images/generations", json={"prompt": "a red cube", "seed": 3,
                                                         "response_format": "url", **SMALL})
    content = httpx.get(f"{server.url}{url.json()['data'][0]['url']}")
    assert content.content == image  # seeded: the same PNG
    edit = post(server, "/v1/images/edits", data={"prompt": "a red cube", "size": "64x64",
                                                  "num_inference_steps": "2"},
                files={"image": ("in.png", encode_png(frames(1)[0]), "image/png")})
    assert edit.status_code == 200, edit.text


def test_a_video_job(server: Server) -> None:
    job = post(server, "/v1/videos", json={"prompt": "a wave", "num_frames": 5, "fps": 5,
                                           **SMALL}).json()
    assert wait_video(server, job["id"])["status"] == "completed"
    video = httpx.get(f"{server.url}/v1/videos/{job['id']}/content").content
    assert len(decode_mp4_frames(video)) == 5


def test_policy_and_inverse_dynamics(server: Server) -> None:
    observation = {"b64_json": base64.b64encode(encode_png(frames(1)[0])).decode()}
    policy = post(server, "/v1/actions/generations", json={
        "input": {"task": "pick up the cup", "image": observation},
        "parameters": {**DROID, "raw_action_dim": 8}})
    assert policy.status_code == 200, policy.text
    action = policy.json()["data"][0]["action"]
    assert action["shape"] == [4, 8] and action["domain_id"] == 8
    assert action["action_mode"] == "policy" and policy.json()["model"] == "tiny"
    clip = data_url("video/mp4", encode_mp4(frames(5), 5))
    inverse = post(server, "/v1/actions/generations", json={
        "input": {"task": "pick", "video": clip},
        "parameters": {**DROID, "action_mode": "inverse_dynamics"}})
    assert inverse.status_code == 200, inverse.text
    assert inverse.json()["data"][0]["action"]["shape"] == [4, 10]


@pytest.mark.parametrize(("parameters", "says"), [
    ({**DROID, "raw_action_dim": 12}, "ask for at most 10"),
    ({"domain_id": 8, "raw_action_dim": 10, "action_horizon": 4}, "give domain_name"),
    ({**DROID, "action_mode": "inverse_dynamics"}, "requires an observation video"),
])
def test_action_refusals(server: Server, parameters: dict, says: str) -> None:
    observation = {"b64_json": base64.b64encode(encode_png(frames(1)[0])).decode()}
    resp = post(server, "/v1/actions/generations", json={
        "input": {"task": "t", "image": observation}, "parameters": parameters})
    assert resp.status_code == 400 and says in resp.json()["error"]["message"], resp.text


def test_forward_dynamics_through_the_video_route(server: Server) -> None:
    job = post(server, "/v1/videos", json={
        "prompt": "move", "action_mode": "forward_dynamics", "action": [[0.0] * 10] * 4,
        "domain_name": "droid_lerobot", "action_horizon": 4, "num_inference_steps": 2,
        "input_reference": data_url("image/png", encode_png(frames(1)[0]))})
    assert job.status_code == 200, job.text
    done = wait_video(server, job.json()["id"])
    assert done["status"] == "completed", done
    video = httpx.get(f"{server.url}/v1/videos/{done['id']}/content").content
    assert len(decode_mp4_frames(video)) == 5


def test_metadata_follows_the_checkpoint(server: Server, tiny_checkpoint: Path,
                                         action_checkpoint: Path) -> None:
    meta = httpx.get(f"{server.url}/v1/actions/metadata").json()
    assert meta["capabilities"]["action_modes"] == ["policy", "inverse_dynamics"]
    assert has_action_heads(str(action_checkpoint))
    assert not has_action_heads(str(tiny_checkpoint))  # the demo's: actions answer 400
