"""The native generation backend's encode reports progress (fake native driver over HTTP): native
SGLang writes its MP4 after its last denoising step and reports nothing else meanwhile, so the
engine counts the growth of the request's output file as progress. An encode longer than the
stage's progress timeout is not taken for a hung engine (issue 33)."""

from __future__ import annotations

from pathlib import Path

from tests.generation.kit import HTTP, native_server, wait_video
from tests.supervision.kit import restarts


def test_a_long_native_encode_is_not_taken_for_a_hung_engine(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    out.mkdir()
    # the MP4 is written over 8 s, in 40 pieces, with no step reported: four times the
    # progress timeout in all, a tenth of it between two pieces
    with native_server(log_dir, out, "--generation.engine.num_gpus", "1",
                       "--generation.engine.performance_mode", "manual",
                       "--generation.factory.progress_timeout_s", "2",
                       "--generation.factory.heartbeat_interval_s", "0.2") as server:
        job = HTTP.post(f"{server.url}/v1/videos", json={
            "prompt": "!slow-write=8 a cube", "width": 32, "height": 32, "num_frames": 9,
            "num_inference_steps": 1}).json()
        done = wait_video(server, job["id"], timeout=120)
        assert done["status"] == "completed", done
        assert HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").status_code == 200
        health = HTTP.get(f"{server.url}/health").json()
        assert health["status"] == "ok" and health["stages"]["generation"]["restarts"] == 0
        assert restarts(server, "generation") == 0
        assert "made no progress" not in server.log()
