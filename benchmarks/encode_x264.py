"""Time Omni's MP4 encoder (``media.encode.encode_mp4``) by thread count and preset.

Usage: python benchmarks/encode_x264.py [--threads 1 8] [--presets medium superfast]
       [--sizes 640x640 1280x720] [--frames 33] [--content smooth noise] [--runs 3]

For each size, content, preset and thread count it encodes the same frames ``--runs`` times and
prints the median and range of the seconds, the MP4's size, and whether every run gave the same
bytes (x264 is deterministic for a fixed thread count, which is why Omni fixes it:
``--generation.factory.x264_threads``). ``smooth`` frames are the scripted generator's (a
gradient and a moving band, closer to real output); ``noise`` frames are seeded random pixels,
x264's worst case. ``superfast`` is the preset of the Reasoner's copy of a generated video.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from typing import Any

import numpy as np

from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.media.encode import DEFAULT_X264_THREADS, X264_PRESETS, VideoEncoding, encode_mp4


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
            "sha256": sorted(digests)[0][:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, DEFAULT_X264_THREADS])
    parser.add_argument("--presets", nargs="+", default=["medium", "superfast"],
                        choices=X264_PRESETS)
    parser.add_argument("--sizes", nargs="+", default=["640x640", "1280x720"])
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--content", nargs="+", default=["smooth", "noise"],
                        choices=("smooth", "noise"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    rows = []
    print(f"{'size':>9} {'content':>7} {'preset':>9} {'threads':>7} {'median s':>9} "
          f"{'range s':>13} {'bytes':>9} same bytes ({args.runs} runs)")
    for size in args.sizes:
        width, height = (int(v) for v in size.lower().split("x"))
        for content in args.content:
            frames = frames_of(content, width, height, args.frames)
            for preset in args.presets:
                for threads in args.threads:
                    row = {"size": size, "content": content, "preset": preset,
                           "threads": threads, "frames": args.frames,
                           **measure(frames, VideoEncoding(preset, threads), args.runs)}
                    rows.append(row)
                    print(f"{size:>9} {content:>7} {preset:>9} {threads:>7} "
                          f"{row['median_s']:>9.2f} {row['min_s']:>6.2f}-{row['max_s']:<6.2f} "
                          f"{row['bytes']:>9} {row['same_bytes']} ({row['sha256']})",
                          flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
