"""x264 presets and the video encoder's progress: the server's list of presets a request may
name (``server.allowed_x264_presets``) and the encoder's reports of life, per frame and packet."""

from __future__ import annotations

import threading

import pytest

from sglang_omni.config import load_config, parse_overrides
from sglang_omni.config.server import X264_PRESET_NAMES, ServerSettings
from sglang_omni.contract.generation_limits import check_x264_preset_allowed
from sglang_omni.contract.job import Job
from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.engines.video_delivery import EncodeCancelled, encode_progress
from sglang_omni.errors import BadRequest, ConfigError
from sglang_omni.media.encode import X264_PRESETS, Mp4Encoder, VideoEncoding, encode_mp4

SCRIPTED = "configs/cpu-scripted.yaml"


def test_config_and_media_name_the_same_presets_in_the_same_order() -> None:
    assert X264_PRESET_NAMES == X264_PRESETS


def test_the_default_allows_up_to_slow() -> None:
    assert ServerSettings().allowed_x264_presets == (
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow")


def test_the_setting_from_a_flag_is_kept_in_x264_order() -> None:
    flags = ["--server.allowed_x264_presets", "[placebo, ultrafast]"]
    settings = load_config(SCRIPTED, parse_overrides(flags), visible_gpus=0).server
    assert settings.allowed_x264_presets == ("ultrafast", "placebo")
    one = load_config(SCRIPTED, parse_overrides(["--server.allowed_x264_presets", "medium"]),
                      visible_gpus=0).server
    assert one.allowed_x264_presets == ("medium",)


@pytest.mark.parametrize(("value", "needle"), [
    ("[turbo]", "'turbo' is not an x264 preset; x264's are ultrafast, superfast"),
    ("3", "expected a list of x264 presets"),
    ("[1, 2]", "expected a list of x264 presets"),
])
def test_a_wrong_setting_is_refused_naming_it(value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(SCRIPTED, parse_overrides(["--server.allowed_x264_presets", value]),
                    visible_gpus=0)
    assert "server.allowed_x264_presets" in str(err.value) and needle in str(err.value)


def test_a_preset_off_the_list_is_400_naming_the_field_and_the_allowed() -> None:
    settings = ServerSettings(allowed_x264_presets=("ultrafast", "medium"))
    check_x264_preset_allowed("medium", settings)
    check_x264_preset_allowed(None, settings)
    with pytest.raises(BadRequest) as err:
        check_x264_preset_allowed("placebo", settings, "stage_params.generation.")
    assert err.value.message == (
        "stage_params.generation.x264_preset: 'placebo' is not allowed on this server; "
        "allowed: ultrafast, medium (server.allowed_x264_presets)")


def test_the_encoder_reports_each_frame_and_each_flushed_packet() -> None:
    frames = [frame_pixels("cube", 0, 64, 48, i) for i in range(12)]
    calls = []
    slow = VideoEncoding("slow", 1, "none")  # x264's lookahead: packets held until the flush
    data = encode_mp4(frames, 8, encoding=slow, progress=lambda: calls.append(1))
    # one per frame taken in, one per packet the flush writes, one as the file is closed
    assert len(calls) > len(frames) + 1
    assert data == encode_mp4(frames, 8, encoding=slow)


def test_frames_can_be_fed_one_at_a_time() -> None:
    frames = [frame_pixels("cube", 0, 64, 48, i) for i in range(6)]
    with Mp4Encoder(64, 48, 8, VideoEncoding("ultrafast", 1)) as encoder:
        for pixels in frames:
            encoder.add(pixels)
        assert encoder.frames == 6
        data = encoder.finish()
    assert data == encode_mp4(frames, 8, encoding=VideoEncoding("ultrafast", 1))
    with Mp4Encoder(64, 48, 8) as encoder, pytest.raises(ValueError, match="frame 0 is 48x64"):
        encoder.add(frame_pixels("cube", 0, 48, 64, 0))


def test_a_cancelled_job_stops_its_encode_at_the_next_frame() -> None:
    beats = []
    job = Job("r1", {}, [], emit=lambda _: None, progress=lambda: beats.append(1))
    progress = encode_progress(job)
    frames = [frame_pixels("cube", 0, 64, 48, i) for i in range(8)]
    with Mp4Encoder(64, 48, 8, VideoEncoding("ultrafast", 1), progress=progress) as encoder:
        encoder.add(frames[0])
        assert beats == [1]
        job.cancelled.set()
        with pytest.raises(EncodeCancelled, match="r1"):
            encoder.add(frames[1])


def test_progress_may_come_from_the_encoding_thread() -> None:
    seen: set[int] = set()
    job = Job("r2", {}, [], emit=lambda _: None,
              progress=lambda: seen.add(threading.get_ident()))
    frames = [frame_pixels("cube", 0, 32, 32, i) for i in range(3)]
    worker = threading.Thread(target=encode_mp4, args=(frames, 8),
                              kwargs={"progress": encode_progress(job)})
    worker.start()
    worker.join()
    assert seen == {worker.ident}
