"""The native generation engine over HTTP, with a fake native driver in place of sglang.

The server, the stage process and the engine are real; only ``DiffGenerator`` is replaced (see
``fake_diffusion``). Its worker is spawned from the stage like native workers and runs the real
cancellation plugin's hook functions when it finds the plugin's entry point.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest

from sglang_omni.engines.synth_media import decode_mp4_frames, encode_png, frame_pixels
from tests.generation.kit import (
    HTTP,
    error_of,
    metric,
    native_server,
    png_size,
    wait_for,
    wait_video,
)
from tests.server import Server

DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


def requests_seen(log_dir: Path) -> list[dict]:
    path = log_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tmp_path_factory.mktemp("fake-log"), tmp_path_factory.mktemp("outputs")


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path]):
    log_dir, out = dirs
    with native_server(log_dir, out, "--model-path", "/models/cosmos3-nano",
                       "--generation.engine.num_gpus", "1",
                       "--generation.engine.performance_mode", "manual") as srv:
        yield srv


# --- one server: pass-through, read-back, folders, failures ------------------------------------
def test_startup_provides_the_plugin_to_the_workers_only(server: Server,
                                                         dirs: tuple[Path, Path]) -> None:
    log_dir, _ = dirs
    log = server.log()
    assert "generation cancellation: the omni_generation_cancellation plugin stops" in log
    assert "the cancellation plugin is active in 1 native worker(s)" in log
    assert (log_dir / "stage_saw_plugin").read_text() == "False"  # the stage itself: no plugin
    assert "Cosmos3 guardrails are OFF: the cosmos-guardrail package is not installed" in log
    kwargs = json.loads((log_dir / "server_kwargs.json").read_text())
    assert kwargs == {"model_path": "/models/cosmos3-nano", "num_gpus": 1,
                      "performance_mode": "manual"}


def test_image_options_reach_native_and_the_folder_goes(server: Server,
                                                        dirs: tuple[Path, Path]) -> None:
    log_dir, out = dirs
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={
        "prompt": "a red cube", "size": "48x32", "seed": 7, "guidance_scale": 3.5,
        "negative_prompt": "blurry", "num_inference_steps": 3, "guardrails": False})
    assert resp.status_code == 200, resp.text
    data = base64.b64decode(resp.json()["data"][0]["b64_json"])
    assert png_size(data) == (48, 32)
    assert data == encode_png(frame_pixels("a red cube", 7, 48, 32, 0))  # the file native wrote
    sent = requests_seen(log_dir)[-1]
    assert {k: sent[k] for k in ("prompt", "width", "height", "seed", "guidance_scale",
                                 "negative_prompt", "num_inference_steps", "num_frames",
                                 "use_guardrails", "save_output", "return_file_paths_only",
                                 "num_outputs_per_prompt")} == {
        "prompt": "a red cube", "width": 48, "height": 32, "seed": 7, "guidance_scale": 3.5,
        "negative_prompt": "blurry", "num_inference_steps": 3, "num_frames": 1,
        "use_guardrails": False, "save_output": True, "return_file_paths_only": True,
        "num_outputs_per_prompt": 1}
    assert Path(sent["output_path"]).parent == out and sent["request_id"] == resp.json()["id"]
    assert not Path(sent["output_path"]).exists()
    assert list(out.iterdir()) == []


def test_video_media_and_action_horizon(server: Server, dirs: tuple[Path, Path]) -> None:
    log_dir, out = dirs
    still = "data:image/png;base64," + base64.b64encode(
        encode_png(frame_pixels("first", 0, 8, 8, 0))).decode()
    job = HTTP.post(f"{server.url}/v1/videos", json={
        "prompt": "a wave", "width": 32, "height": 32, "fps": 8, "input_reference": still,
        "action_mode": "forward_dynamics", "action_horizon": 4,
        "action": [[0.0] * 8] * 4, "domain_name": "droid_lerobot"}).json()
    done = wait_video(server, job["id"])
    assert done["status"] == "completed", done
    frames = decode_mp4_frames(HTTP.get(f"{server.url}/v1/videos/{job['id']}/content").content)
    sent = requests_seen(log_dir)[-1]
    assert len(frames) == sent["num_frames"] == 5  # action_horizon + 1
    # the data URL became a file in the request's folder, read by native and removed with it
    assert sent["image_path"].startswith(sent["output_path"] + os.sep)
    assert "action_horizon" not in sent and sent["action_mode"] == "forward_dynamics"
    assert list(out.iterdir()) == []


def test_x264_preset_reaches_native_only_when_asked(server: Server,
                                                    dirs: tuple[Path, Path]) -> None:
    """Native writes its own MP4: the request's x264_preset goes to it; the server's default
    preset (an hf/scripted setting) does not."""
    log_dir, _ = dirs
    for extra in ({"x264_preset": "veryfast"}, {}):
        job = HTTP.post(f"{server.url}/v1/videos", json={
            "prompt": "a preset", "width": 32, "height": 32, "num_frames": 2, **extra}).json()
        assert wait_video(server, job["id"])["status"] == "completed", job
        assert requests_seen(log_dir)[-1].get("x264_preset") == extra.get("x264_preset")
        HTTP.delete(f"{server.url}/v1/videos/{job['id']}")


def test_sound_needs_audio_turned_on(server: Server) -> None:
    job = HTTP.post(f"{server.url}/v1/videos", json={
        "prompt": "rain", "num_frames": 5, "generate_sound": True}).json()
    done = wait_video(server, job["id"])
    assert done["status"] == "failed" and done["error"]["code"] == 400
    assert "stages.generation.factory.audio" in done["error"]["message"]


def test_action_goes_to_the_native_action_route(server: Server, dirs: tuple[Path, Path]) -> None:
    _, out = dirs
    still = "data:image/png;base64," + base64.b64encode(
        encode_png(frame_pixels("obs", 0, 8, 8, 0))).decode()
    resp = HTTP.post(f"{server.url}/v1/actions/generations",
                     json={"input": {"task": "pick", "image": still}, "parameters": DROID})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["data"][0]["action"]["shape"] == [16, 8]
    assert body["model"] != "fake"  # Omni's served model name
    assert body["image"].endswith(".png") and body["image"] != still  # materialized for native
    refused = HTTP.post(f"{server.url}/v1/actions/generations",
                        json={"input": {"task": "pick"}, "parameters": {"domain_name": "mars"}})
    assert refused.status_code == 400
    assert "native SGLang refused the request" in error_of(refused)["message"]
    assert "unknown embodiment 'mars'" in error_of(refused)["message"]
    early = HTTP.post(f"{server.url}/v1/actions/generations",  # native's check, before work
                      json={"input": {"task": "pick"}, "parameters": {}})
    assert early.status_code == 400
    assert error_of(early)["message"] == \
        "Cosmos3 action requests require domain_name or domain_id"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(("prompt", "status", "says"), [
    ("!no-media cube", 500, "Guardrail blocked prompt."),
    ("!refuse cube", 400, "native SGLang refused the request: width must be a multiple of 16"),
    ("!bad-file cube", 500, "is not image/png"),
    ("!oom cube", 500, "the generation stage ran out of GPU memory for this request (Generation "
     "failed: CUDA out of memory. Tried to allocate 9.00 GiB (fake native worker)); ask for a "
     "smaller width and height or fewer num_frames, or give the stage more memory (a larger "
     "stages.generation.gpu_memory_fraction"),
])
def test_native_failures(server: Server, dirs: tuple[Path, Path], prompt: str, status: int,
                         says: str) -> None:
    _, out = dirs
    resp = HTTP.post(f"{server.url}/v1/images/generations", json={"prompt": prompt})
    assert resp.status_code == status
    assert says in error_of(resp)["message"]
    assert list(out.iterdir()) == []


def test_no_media_reason_is_in_the_generation_stage_log(server: Server) -> None:
    HTTP.post(f"{server.url}/v1/images/generations", json={"prompt": "!no-media again"})
    assert "native SGLang ended the image generation without media: Generation failed: " \
           "Guardrail blocked prompt." in server.log()


# --- cancellation ------------------------------------------------------------------------------
SLOW = {"FAKE_STEP_S": "0.2"}
STEPS = 200  # 40 s unless stopped (server.max_inference_steps allows 200)


def disconnect_after(server: Server, seconds: float, steps: int = STEPS) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/images/generations", timeout=seconds,
                   json={"prompt": "slow", "num_inference_steps": steps})


def test_plugin_stops_an_aborted_generation_within_a_step(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    with native_server(log_dir, out, env=SLOW) as server:
        disconnect_after(server, 1.5)
        wait_for(lambda: metric(server, "aborted") == 1, timeout=15)
        rid = requests_seen(log_dir)[-1]["request_id"]
        log = server.log()
        assert f"request {rid} aborted: its native generation stops at the next denoising " \
               "step" in log
        assert f"request {rid}: native generation ended" in log
        assert not (log_dir / f"finished-{rid}").exists()  # stopped mid-denoising
        quick = HTTP.post(f"{server.url}/v1/images/generations",
                          json={"prompt": "quick", "num_inference_steps": 1})
        assert quick.status_code == 200
        assert list(out.iterdir()) == []


def test_without_the_plugin_startup_warns_and_an_abort_waits(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    with native_server(log_dir, out, "--generation.factory.cancellation_plugin", "false",
                       env={"FAKE_STEP_S": "0.05",
                            "SGLANG_DISABLE_COSMOS3_GUARDRAILS": "1"}) as server:
        log = server.log()
        assert "WARNING generation cancellation is off: the omni_generation_cancellation " \
               "plugin is turned off (stages.generation.factory.cancellation_plugin: false); " \
               "an aborted request keeps the generation stage busy until its native " \
               "generation finishes" in log
        assert "Cosmos3 guardrails are OFF: SGLANG_DISABLE_COSMOS3_GUARDRAILS=1" in log
        assert not (log_dir / "stage_saw_plugin").exists()  # nothing provided
        disconnect_after(server, 0.5, steps=40)
        wait_for(lambda: metric(server, "aborted") == 1, timeout=15)
        rid = requests_seen(log_dir)[-1]["request_id"]
        assert (log_dir / f"finished-{rid}").exists()  # native ran to the end
        assert "it keeps the generation stage busy until its native generation finishes" \
            in server.log()


def test_more_than_one_native_gpu_warns(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    guardrail = tmp_path / "site" / "cosmos_guardrail"
    guardrail.mkdir(parents=True)
    (guardrail / "__init__.py").write_text("")
    with native_server(log_dir, out, "--generation.engine.num_gpus", "2",
                       env={"PYTHONPATH": str(guardrail.parent)}) as server:
        log = server.log()
        assert "WARNING generation cancellation is off: generation uses 2 native GPUs and " \
               "the omni_generation_cancellation plugin serves a single one" in log
        assert "Cosmos3 guardrails are ON" in log


def test_sglang_plugins_without_our_name_stops_startup(tmp_path: Path) -> None:
    server = native_server(tmp_path, tmp_path / "out", wait_ready=False,
                           env={"SGLANG_PLUGINS": "some_other_plugin"})
    try:
        assert server.proc.wait(60) != 0
        assert "SGLANG_PLUGINS is set to 'some_other_plugin', which does not list " \
               "omni_generation_cancellation" in server.log()
        assert "SGLANG_PLUGINS=some_other_plugin,omni_generation_cancellation" in server.log()
    finally:
        server.stop()


def test_sglang_plugins_listing_our_name_starts(tmp_path: Path) -> None:
    with native_server(tmp_path, tmp_path / "out", env={
            "SGLANG_PLUGINS": "some_other_plugin,omni_generation_cancellation"}) as server:
        assert "the cancellation plugin is active in 1 native worker(s)" in server.log()


def test_native_cancellation_is_used_when_sglang_has_it(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    with native_server(log_dir, out, env={"FAKE_NATIVE_ABORT": "1", "FAKE_STEP_S": "0.05",
                                          "SGLANG_PLUGINS": "other"}) as server:
        assert "generation cancellation: the installed SGLang cancels generations itself " \
               "(DiffGenerator.abort_request)" in server.log()
        assert not (log_dir / "stage_saw_plugin").exists()
        disconnect_after(server, 0.5, steps=40)
        wait_for(lambda: metric(server, "aborted") == 1, timeout=15)
        rid = requests_seen(log_dir)[-1]["request_id"]
        assert (log_dir / "native_aborts").read_text().split() == [rid]


# --- worker death ------------------------------------------------------------------------------
def test_worker_death_fails_the_request_promptly(tmp_path: Path) -> None:
    log_dir, out = tmp_path / "log", tmp_path / "out"
    log_dir.mkdir()
    with native_server(log_dir, out, env=SLOW) as server:
        result: dict = {}

        def client() -> None:
            result["resp"] = httpx.post(f"{server.url}/v1/images/generations", timeout=60,
                                        json={"prompt": "slow", "num_inference_steps": STEPS})

        thread = threading.Thread(target=client)
        thread.start()
        wait_for(lambda: bool(requests_seen(log_dir)))
        worker = int((log_dir / "worker.pid").read_text())
        os.kill(worker, signal.SIGKILL)
        thread.join(30)  # answered with the worker's exit, not after the 60 s left to run
        resp = result["resp"]
        assert resp.status_code == 500
        message = error_of(resp)["message"]
        assert "native generation worker sglang-diffusionWorker-0" in message
        assert f"pid {worker}) exited with code -9" in message
        wait_for(lambda: HTTP.get(f"{server.url}/health").status_code == 503, timeout=20)
        assert list(out.iterdir()) == []


# --- audiovisual startup checks ----------------------------------------------------------------
def checkpoint(root: Path, *, sound: bool) -> Path:
    root.mkdir(parents=True)
    index = {"_class_name": "Cosmos3OmniPipeline", "transformer": ["x", "y"]}
    if sound:
        index["sound_tokenizer"] = ["x", "y"]
    (root / "model_index.json").write_text(json.dumps(index))
    (root / "transformer").mkdir()
    (root / "transformer" / "config.json").write_text(json.dumps({"sound_gen": sound}))
    return root


def fake_ffmpeg(path: Path, *, aac: bool) -> Path:
    encoders = " V....D libx264              H.264\n"
    if aac:
        encoders += " A....D aac                  AAC (Advanced Audio Coding)\n"
    path.write_text(f"#!{sys.executable}\nprint('''Encoders:\n{encoders}''')\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("sound", "aac", "says"), [
    (False, True, "lists no sound_tokenizer"),
    (True, False, "needs FFmpeg with the AAC encoder"),
])
def test_audio_startup_refuses_what_cannot_work(tmp_path: Path, sound: bool, aac: bool,
                                                says: str) -> None:
    model = checkpoint(tmp_path / "ckpt", sound=sound)
    ffmpeg = fake_ffmpeg(tmp_path / "ffmpeg", aac=aac)
    server = native_server(tmp_path, tmp_path / "out", "--model-path", str(model),
                           "--generation.factory.audio", "true", wait_ready=False,
                           env={"FAKE_FFMPEG": str(ffmpeg)})
    try:
        assert server.proc.wait(60) != 0
        assert says in server.log() and "stages.generation.factory.audio" in server.log()
    finally:
        server.stop()


def test_audio_on_passes_the_sound_duration(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    model = checkpoint(tmp_path / "ckpt", sound=True)
    ffmpeg = fake_ffmpeg(tmp_path / "ffmpeg", aac=True)
    with native_server(log_dir, tmp_path / "out", "--model-path", str(model),
                       "--generation.factory.audio", "true",
                       env={"FAKE_FFMPEG": str(ffmpeg)}) as server:
        assert "audiovisual generation is on" in server.log()
        job = HTTP.post(f"{server.url}/v1/videos", json={
            "prompt": "rain", "num_frames": 6, "fps": 24, "width": 16, "height": 16,
            "generate_sound": True}).json()
        assert wait_video(server, job["id"])["status"] == "completed"
        sent = requests_seen(log_dir)[-1]
        assert sent["sound_duration"] == 0.25 and "generate_sound" not in sent
