"""The SDK's direct generation calls: caller-owned saved files, actions, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_omni.client import Client, OmniClientError
from sglang_omni.engines.synth_media import decode_mp4_frames, encode_png, frame_pixels
from tests.generation.kit import HTTP, png_size, scripted_server
from tests.server import Server


@pytest.fixture(scope="module")
def server():
    with scripted_server("--generation.factory.step_time_s", "0.01") as srv:
        yield srv


def test_image_is_saved_in_the_callers_folder(server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "mine" / "images"
    with Client(server.url) as client:
        files = client.generate_media("a red cube", output_dir=folder, size="40x24", seed=5,
                                      file_name="cube")
    assert files == [folder / "cube.png"]
    data = files[0].read_bytes()
    assert png_size(data) == (40, 24)
    assert data == encode_png(frame_pixels("a red cube", 5, 40, 24, 0))


def test_video_is_saved_and_the_server_keeps_no_copy(server: Server, tmp_path: Path) -> None:
    with Client(server.url) as client:
        files = client.generate_media("a wave", kind="video", output_dir=tmp_path, width=32,
                                      height=32, num_frames=3, poll_interval_s=0.05)
    assert len(files) == 1 and files[0].parent == tmp_path and files[0].suffix == ".mp4"
    assert len(decode_mp4_frames(files[0].read_bytes())) == 3
    assert HTTP.get(f"{server.url}/v1/videos").json()["data"] == []  # deleted once saved


def test_existing_files_are_never_overwritten(server: Server, tmp_path: Path) -> None:
    (tmp_path / "taken.png").write_bytes(b"mine")
    with Client(server.url) as client, pytest.raises(FileExistsError):
        client.generate_media("cube", output_dir=tmp_path, file_name="taken", size="8x8")
    assert (tmp_path / "taken.png").read_bytes() == b"mine"


def test_failures_raise_with_the_servers_error(server: Server, tmp_path: Path) -> None:
    with Client(server.url) as client:
        with pytest.raises(OmniClientError) as refused:
            client.generate_media("cube", output_dir=tmp_path, output_path="/tmp")
        assert refused.value.status == 400
        with pytest.raises(OmniClientError) as failed:
            client.generate_media("!no-media wave", kind="video", output_dir=tmp_path,
                                  num_frames=2, poll_interval_s=0.05)
        assert failed.value.status == 500 and "ended without media" in failed.value.message
        with pytest.raises(ValueError):
            client.generate_media("cube", output_dir=tmp_path, file_name="../escape")
    assert list(tmp_path.iterdir()) == []
    assert HTTP.get(f"{server.url}/v1/videos").json()["data"] == []


def test_action_through_the_sdk(server: Server) -> None:
    with Client(server.url) as client:
        out = client.generate_action({
            "input": {"task": "open the drawer"},
            "parameters": {"domain_name": "droid_lerobot", "raw_action_dim": 8}})
    assert out["data"][0]["action"]["shape"] == [16, 8]
