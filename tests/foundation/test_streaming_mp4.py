"""``engines.video_delivery.StreamingMp4``: frames handed in batch by batch (as a VAE decodes
them) give the same MP4 as one whole encode; ``encode`` is the time after the last frame; a
dropped or cancelled encode ends its worker thread."""

from __future__ import annotations

import asyncio

import pytest

from sglang_omni.contract.job import Job
from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.engines.video_delivery import EncodeCancelled, StreamingMp4
from sglang_omni.media.encode import VideoEncoding, encode_mp4

FRAMES = [frame_pixels("cube", 0, 64, 48, i) for i in range(9)]


def job() -> Job:
    return Job("s", {}, [], emit=lambda _: None)


@pytest.mark.parametrize("tune", ["zerolatency", "none"])
def test_batches_give_the_bytes_of_one_whole_encode(tune: str) -> None:
    encoding = VideoEncoding("medium", 2, tune)

    async def stream() -> tuple[bytes, Job]:
        owner = job()
        mp4 = StreamingMp4(owner, 64, 48, 8, encoding)
        for batch in (FRAMES[:1], FRAMES[1:5], FRAMES[5:]):
            mp4.add(batch)
        mp4.finish()
        return await mp4.result(), owner

    data, owner = asyncio.run(stream())
    assert data == encode_mp4(FRAMES, 8, encoding=encoding)
    assert owner.spans["encode"] >= 0.0 and set(owner.spans) == {"encode"}


def test_a_dropped_encode_ends_its_thread_and_a_cancelled_job_stops_it() -> None:
    async def dropped() -> StreamingMp4:
        mp4 = StreamingMp4(job(), 64, 48, 8, VideoEncoding("ultrafast", 1))
        mp4.add(FRAMES[:1])
        mp4.abandon()
        with pytest.raises(EncodeCancelled):
            await mp4.result()
        return mp4

    mp4 = asyncio.run(dropped())
    mp4._thread.join(30)
    assert not mp4._thread.is_alive()

    async def cancelled() -> None:
        owner = job()
        mp4 = StreamingMp4(owner, 64, 48, 8, VideoEncoding("ultrafast", 1))
        owner.cancelled.set()
        mp4.add(FRAMES[:2])
        mp4.finish()
        with pytest.raises(EncodeCancelled, match="cancelled while its video was encoded"):
            await mp4.result()

    asyncio.run(cancelled())


def test_the_tune_is_a_generation_setting_beside_the_preset() -> None:
    """``--generation.factory.x264_tune`` reaches the engine's encoding (zerolatency by
    default); a tune x264 does not have is refused at load, naming the key."""
    from sglang_omni.config import load_config, parse_overrides
    from sglang_omni.contract.encoding_settings import video_encoding
    from sglang_omni.errors import ConfigError

    def encoding(*flags: str) -> VideoEncoding:
        config = load_config("configs/cpu-scripted.yaml", parse_overrides(list(flags)),
                             visible_gpus=0)
        return video_encoding(config.stage("generation").factory)

    assert encoding() == VideoEncoding("medium", 8, "zerolatency")
    assert encoding("--generation.factory.x264_tune", "none").tune == "none"
    with pytest.raises(ConfigError, match="x264_tune"):
        encoding("--generation.factory.x264_tune", "ludicrous")
    assert VideoEncoding(tune="none").x264_options().get("tune") is None
    assert VideoEncoding().x264_options()["tune"] == "zerolatency"
