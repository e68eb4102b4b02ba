"""The native generation stage's pure parts: the cancellation plan, the plugin's provision,
option mapping, action media, output and startup checks (no server, no sglang)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_omni.contract.parallelism import native_gpu_count
from sglang_omni.engines.guardrails import guardrails_state
from sglang_omni.engines.native import cancellation_plugin as plugin
from sglang_omni.engines.native.cancellation_plugin_site import CancellationPluginSite
from sglang_omni.engines.native.generation import sampling_kwargs
from sglang_omni.engines.native.generation_cancellation import (
    PluginNotAllowed,
    check_plugin_allowlist,
    native_abort_method,
    plan_cancellation,
)
from sglang_omni.engines.native.generation_checks import (
    AudioUnsupported,
    check_ffmpeg_aac,
    read_generated,
)
from sglang_omni.engines.synth_media import encode_png, frame_pixels
from sglang_omni.errors import BadRequest, ServerError
from sglang_omni.media.action_refs import action_media_refs, replace_action_media


# --- the cancellation plan ---------------------------------------------------------------------
def plan(**kw: object):
    args = {"plugin_enabled": True, "num_gpus": 1, "native_abort": None, "env": {}, **kw}
    return plan_cancellation(**args)  # type: ignore[arg-type]


def test_the_plugin_by_default() -> None:
    chosen = plan()
    assert chosen.mode == "plugin" and chosen.warning is None


def test_native_cancellation_wins_over_the_plugin() -> None:
    chosen = plan(native_abort="abort_request", env={"SGLANG_PLUGINS": "other"})
    assert chosen.mode == "native" and "DiffGenerator.abort_request" in chosen.reason


@pytest.mark.parametrize(("kw", "reason"), [
    ({"plugin_enabled": False}, "(stages.generation.factory.cancellation_plugin: false)"),
    ({"num_gpus": 4}, "generation uses 4 native GPUs"),
])
def test_no_cancellation_warns_naming_the_reason(kw: dict, reason: str) -> None:
    chosen = plan(**kw)
    assert chosen.mode == "none"
    assert reason in chosen.warning
    assert chosen.warning.endswith("an aborted request keeps the generation stage busy until "
                                   "its native generation finishes")


@pytest.mark.parametrize("value", ["", "  ", "omni_generation_cancellation",
                                   "a, omni_generation_cancellation ,b"])
def test_allowlists_that_admit_the_plugin(value: str) -> None:
    check_plugin_allowlist({"SGLANG_PLUGINS": value})
    check_plugin_allowlist({})


def test_an_allowlist_without_the_plugin_stops_startup() -> None:
    with pytest.raises(PluginNotAllowed, match="does not list omni_generation_cancellation"):
        plan(env={"SGLANG_PLUGINS": "xpu_hooks"})


def test_native_abort_is_detected_by_capability() -> None:
    class Pinned:
        def generate(self) -> None: ...

    class Later(Pinned):
        def abort_request(self, rid: str) -> None: ...

    assert native_abort_method(Pinned) is None
    assert native_abort_method(Later) == "abort_request"
    assert native_abort_method(None) is None


@pytest.mark.parametrize(("args", "gpus"), [
    ({}, 1), ({"num_gpus": 2}, 2), ({"tp_size": 4}, 4), ({"num_gpus": True}, 1),
])
def test_native_gpu_count(args: dict, gpus: int) -> None:
    assert native_gpu_count(args) == gpus


# --- the plugin's provision --------------------------------------------------------------------
FIND = ("import json, sys\nfrom importlib.metadata import entry_points\n"
        "print(json.dumps([f'{e.name}={e.value}' for e in "
        "entry_points(group='sglang.multimodal_gen.plugins')]))")


def entry_points_seen(extra_path: str | None) -> list[str]:
    code = FIND if extra_path is None else f"import sys; sys.path.append({extra_path!r})\n{FIND}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ""})
    return json.loads(out.stdout)


def test_the_site_provides_the_entry_point_to_children_only(tmp_path: Path) -> None:
    site = CancellationPluginSite(tmp_path)
    calls: list[bool] = []
    site.activate(lambda: calls.append(str(site.path) in sys.path))
    try:
        assert calls == [False]  # own registration ran before the folder was on the path
        assert str(site.path) in sys.path
        assert os.environ[plugin.STATUS_DIR_ENV] == str(site.status_dir)
        expected = "omni_generation_cancellation=" \
                   "sglang_omni.engines.native.cancellation_plugin:register"
        assert entry_points_seen(str(site.path)) == [expected]
        assert expected not in entry_points_seen(None)  # another process does not see it
        plugin.report_registered()
        assert [r["pid"] for r in site.registrations()] == [os.getpid()]
    finally:
        site.close()
    assert str(site.path) not in sys.path and not site.path.exists()
    assert plugin.STATUS_DIR_ENV not in os.environ


# --- the hook functions ------------------------------------------------------------------------
def test_hooks_stop_a_cancelled_request_at_the_next_step(tmp_path: Path) -> None:
    steps: list[int] = []

    def loop(_stage: object, batch: object) -> str:
        for i in range(10):
            plugin.before_denoising_step(object(), step_index=i, num_steps=10)
            steps.append(i)
            if i == 3:
                plugin.request_cancel(tmp_path)
        return "done"

    batch = type("Batch", (), {"output_path": str(tmp_path)})()
    with pytest.raises(plugin.GenerationCancelled, match="at denoising step 4 of 10"):
        plugin.around_denoise_loop(loop, object(), batch)
    assert steps == [0, 1, 2, 3]
    with pytest.raises(plugin.GenerationCancelled, match="before its first denoising step"):
        plugin.around_denoise_loop(loop, object(), batch)
    other = type("Batch", (), {"output_path": str(tmp_path / "other")})()
    steps.clear()
    (tmp_path / "other").mkdir()
    assert plugin.around_denoise_loop(loop, object(), other) == "done"  # only its own request
    plugin.before_denoising_step(object(), 0, 1)  # outside a loop: nothing to stop


# --- option mapping ----------------------------------------------------------------------------
def test_sampling_kwargs(tmp_path: Path) -> None:
    image = sampling_kwargs("image", "p", {"num_frames": 9, "seed": None, "width": 64},
                            request_id="r1", folder=tmp_path)
    assert image["num_frames"] == 1 and "seed" not in image and image["width"] == 64
    assert image["output_path"] == str(tmp_path) and image["request_id"] == "r1"
    assert image["save_output"] is True and image["return_file_paths_only"] is True
    video = sampling_kwargs("video", "p", {"action_horizon": 8, "generate_sound": True,
                                           "fps": 12}, request_id="r", folder=tmp_path)
    assert video["num_frames"] == 9 and video["sound_duration"] == 0.75
    assert "action_horizon" not in video and "generate_sound" not in video
    silent = sampling_kwargs("video", "p", {"generate_sound": False}, request_id="r",
                             folder=tmp_path)
    assert silent["sound_duration"] == 0.0
    with pytest.raises(BadRequest, match="num_frames"):
        sampling_kwargs("video", "p", {"generate_sound": True}, request_id="r", folder=tmp_path)


def test_action_media_refs_are_found_and_replaced() -> None:
    body = {"image": "a.png", "input": {"video_path": "v.mp4", "observation": {
        "images": {"wrist": "w.png", "base": [[0, 0, 0]]}, "image": ["x.png", {"b64_json": "Q"}]}},
        "parameters": {"video_path": "p.mp4"}}
    assert action_media_refs(body) == [
        ("image", "a.png"), ("input.video_path", "v.mp4"),
        ("input.observation.image[0]", "x.png"), ("input.observation.images.wrist", "w.png"),
        ("parameters.video_path", "p.mp4")]
    replace_action_media(body, lambda label, ref: f"/tmp/{label}")
    assert body["image"] == "/tmp/image"
    assert body["input"]["observation"]["image"] == ["/tmp/input.observation.image[0]",
                                                     {"b64_json": "Q"}]
    assert body["input"]["observation"]["images"]["base"] == [[0, 0, 0]]


# --- output and startup checks -----------------------------------------------------------------
def test_read_generated(tmp_path: Path) -> None:
    png = encode_png(frame_pixels("x", 0, 4, 4, 0))
    (tmp_path / "ok.png").write_bytes(png)
    assert read_generated(str(tmp_path / "ok.png"), tmp_path, "image") == (png, "image/png")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ServerError, match="empty"):
        read_generated(str(tmp_path / "empty.png"), tmp_path, "image")
    with pytest.raises(ServerError, match="is not video/mp4"):
        read_generated(str(tmp_path / "ok.png"), tmp_path, "video")
    with pytest.raises(ServerError, match="outside"):
        read_generated(str(tmp_path / "ok.png"), tmp_path / "sub", "image")
    with pytest.raises(ServerError, match="cannot be read"):
        read_generated(str(tmp_path / "missing.png"), tmp_path, "image")


def test_guardrails_state() -> None:
    on, line = guardrails_state({"SGLANG_DISABLE_COSMOS3_GUARDRAILS": "1"})
    assert not on and "SGLANG_DISABLE_COSMOS3_GUARDRAILS=1" in line


def test_ffmpeg_that_does_not_run(tmp_path: Path) -> None:
    with pytest.raises(AudioUnsupported, match="does not run"):
        check_ffmpeg_aac(str(tmp_path / "no-ffmpeg"))
