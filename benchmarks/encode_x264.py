"""Time Omni's MP4 encoder (``media.encode.encode_mp4``) by thread count, preset and tune.

Usage: python benchmarks/encode_x264.py [--threads 1 8] [--presets medium superfast]
       [--tunes none zerolatency] [--sizes 640x640 1280x720] [--frames 33]
       [--content smooth noise] [--runs 3] [--stream [--over 2.0]] [--json PATH]

For each size, content, preset and thread count it encodes the same frames ``--runs`` times and
prints the median and range of the seconds, the MP4's size, and whether every run gave the same
bytes (x264 is deterministic for a fixed thread count, which is why Omni fixes it:
``--generation.factory.x264_threads``). ``smooth`` frames are the scripted generator's (a
gradient and a moving band, closer to real output); ``noise`` frames are seeded random pixels,
x264's worst case.

``--stream`` also hands the frames in as a chunked VAE decode would (1 frame, then 4 a chunk,
spread evenly over ``--over`` seconds) to the product's streaming encoder
(``engines.video_delivery.StreamingMp4``) and reports ``after_last_s``: the seconds from the last
frame handed in to the MP4's bytes (the generation's ``encode`` span), beside ``encode_s``, the
whole encode with every frame at hand. Issue 34's grid on the H200 host::

    python benchmarks/encode_x264.py --stream --sizes 1280x720 --frames 33 --threads 8 16 \
        --presets ultrafast superfast veryfast faster fast medium --tunes none zerolatency \
        --json benchmarks/results/encode_stream_h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
from typing import Any

import numpy as np

from sglang_omni.contract.job import Job
from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.engines.video_delivery import StreamingMp4
from sglang_omni.media.encode import (
    DEFAULT_X264_THREADS,
    DEFAULT_X264_TUNE,
    X264_PRESETS,
    X264_TUNES,
    VideoEncoding,
    encode_mp4,
)

#: Frames a chunked Cosmos3 VAE decode yields after its first (which yields 1).
VAE_CHUNK = 4


def frames_of(content: str, width: int, height: int, count: int) -> list[Any]:
    if content == "noise":
        rng = np.random.default_rng(0)
        return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]
    return [frame_pixels("a red cube turning", 0, width, height, i) for i in range(count)]


def measure(frames: list[Any], encoding: VideoEncoding, runs: int) -> dict[str, Any]:
    seconds, digests, size = [], set(), 0
    for _ in range(runs):
        started = time.perf_counter()
        data = encode_mp4(frames, 24, encoding=encoding)
        seconds.append(time.perf_counter() - started)
        digests.add(hashlib.sha256(data).hexdigest())
        size = len(data)
    return {"median_s": statistics.median(seconds), "min_s": min(seconds),
            "max_s": max(seconds), "bytes": size, "same_bytes": len(digests) == 1,
            "sha256": sorted(digests)[0][:16], "sha256_full": sorted(digests)[0]}


def vae_chunks(frames: list[Any]) -> list[list[Any]]:
    """``frames`` as a causal VAE decodes them: the first alone, then ``VAE_CHUNK`` at a time."""
    return [frames[:1]] + [frames[i:i + VAE_CHUNK] for i in range(1, len(frames), VAE_CHUNK)]


async def streamed(frames: list[Any], encoding: VideoEncoding, over: float) -> tuple[bytes, float]:
    """The MP4 of ``frames`` handed in chunk by chunk over ``over`` seconds; with the seconds
    from the last frame handed in to its bytes."""
    job = Job("bench", {}, [], emit=lambda _: None)
    height, width = frames[0].shape[:2]
    mp4 = StreamingMp4(job, width, height, 24, encoding)
    chunks = vae_chunks(frames)
    started = time.perf_counter()
    try:
        for index, chunk in enumerate(chunks):
            due = started + over * index / max(1, len(chunks) - 1)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            mp4.add(chunk)
        mp4.finish()
        data = await mp4.result()
    finally:
        mp4.abandon()
    return data, job.spans["encode"]


def measure_stream(frames: list[Any], encoding: VideoEncoding, runs: int,
                   over: float) -> dict[str, Any]:
    """``measure``'s figures plus ``after_last_s`` (median, range) of streamed encodes, and
    whether the streamed MP4 is the same bytes as the whole encode's."""
    whole = measure(frames, encoding, runs)
    after, digests = [], set()
    for _ in range(runs):
        data, left = asyncio.run(streamed(frames, encoding, over))
        after.append(left)
        digests.add(hashlib.sha256(data).hexdigest())
    return {**whole, "encode_s": whole["median_s"], "over_s": over,
            "after_last_s": statistics.median(after), "after_last_min_s": min(after),
            "after_last_max_s": max(after),
            "stream_same_bytes": digests == {whole["sha256_full"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, DEFAULT_X264_THREADS])
    parser.add_argument("--presets", nargs="+", default=["medium", "superfast"],
                        choices=X264_PRESETS)
    parser.add_argument("--tunes", nargs="+", default=[DEFAULT_X264_TUNE], choices=X264_TUNES)
    parser.add_argument("--sizes", nargs="+", default=["640x640", "1280x720"])
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--content", nargs="+", default=["smooth", "noise"],
                        choices=("smooth", "noise"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stream", action="store_true",
                        help="also hand the frames in over --over seconds, as a chunked VAE "
                        "decode does, and report the seconds left after the last frame")
    parser.add_argument("--over", type=float, default=2.0,
                        help="--stream: seconds from the first chunk to the last")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    rows = []
    print(f"{'size':>9} {'content':>7} {'preset':>9} {'tune':>11} {'threads':>7} "
          f"{'median s':>9} {'range s':>13} {'bytes':>9} "
          + (f"{'after last s':>12} {'range s':>13} " if args.stream else "")
          + f"same bytes ({args.runs} runs)")
    for size in args.sizes:
        width, height = (int(v) for v in size.lower().split("x"))
        for content in args.content:
            frames = frames_of(content, width, height, args.frames)
            for preset in args.presets:
                for tune in args.tunes:
                    for threads in args.threads:
                        encoding = VideoEncoding(preset, threads, tune)
                        figures = measure_stream(frames, encoding, args.runs, args.over) \
                            if args.stream else measure(frames, encoding, args.runs)
                        row = {"size": size, "content": content, "preset": preset,
                               "tune": tune, "threads": threads, "frames": args.frames,
                               **figures}
                        rows.append(row)
                        after = f"{row['after_last_s']:>12.2f} " \
                            f"{row['after_last_min_s']:>6.2f}-{row['after_last_max_s']:<6.2f} " \
                            if args.stream else ""
                        same = row["same_bytes"] and row.get("stream_same_bytes", True)
                        print(f"{size:>9} {content:>7} {preset:>9} {tune:>11} {threads:>7} "
                              f"{row['median_s']:>9.2f} "
                              f"{row['min_s']:>6.2f}-{row['max_s']:<6.2f} "
                              f"{row['bytes']:>9} {after}{same} ({row['sha256']})", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
