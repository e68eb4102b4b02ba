"""What each x264 preset costs at the largest video the server's default limits allow: the
figures behind ``server.allowed_x264_presets`` (docs/configuration.md shows them).

Usage: python benchmarks/encode_presets.py [--frames 17] [--threads 8]
       [--presets ultrafast ... placebo] [--json benchmarks/results/encode_presets_cpu.json]

The largest video the defaults allow is ``server.max_pixels`` (1920x1088) by ``server.max_frames``
(257) frames. Encoding that at every preset would take hours on a small machine, so each preset
encodes ``--frames`` frames of that size (the scripted generator's frames: a gradient and a
moving band) once, and the seconds per frame are scaled to the full length (x264's cost is
about linear in frames). It prints, per preset, the measured seconds, the seconds per frame, the
estimate for the largest video, and that estimate relative to the server's default preset
(``stages.generation.factory.x264_preset``, medium); the machine's load averages are printed
before and after, since this is CPU time on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

from sglang_omni.config.server import ServerSettings
from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.media.encode import (
    DEFAULT_X264_PRESET,
    DEFAULT_X264_THREADS,
    X264_PRESETS,
    VideoEncoding,
    encode_mp4,
)


def largest_video(settings: ServerSettings) -> tuple[int, int, int]:
    """(width, height, frames) of the largest 16:9-ish video the limits allow: 1920x1088 (a
    multiple of 16) when it fits ``max_pixels``, and ``max_frames`` frames."""
    width, height = 1920, 1088
    while width * height > settings.max_pixels:
        width, height = width - 16, height - 16
    return width, height, settings.max_frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=17, help="frames encoded per preset")
    parser.add_argument("--threads", type=int, default=DEFAULT_X264_THREADS)
    parser.add_argument("--presets", nargs="+", default=list(X264_PRESETS),
                        choices=X264_PRESETS)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    width, height, full = largest_video(ServerSettings())
    load_before = os.getloadavg()
    print(f"{platform.node()}: {os.cpu_count()} CPUs, load {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}; {args.frames} frames of {width}x{height} "
          f"per preset, {args.threads} x264 threads; scaled to {full} frames", flush=True)
    frames = [frame_pixels("a red cube turning", 0, width, height, i) for i in range(args.frames)]
    rows: list[dict[str, Any]] = []
    print(f"{'preset':>10} {'seconds':>8} {'s/frame':>8} {'est. s @' + str(full):>12} "
          f"{'x default':>9} {'bytes':>9}", flush=True)
    for preset in args.presets:
        started = time.perf_counter()
        data = encode_mp4(frames, 24, encoding=VideoEncoding(preset, args.threads))
        seconds = time.perf_counter() - started
        per_frame = seconds / args.frames
        rows.append({"preset": preset, "seconds": round(seconds, 3),
                     "seconds_per_frame": round(per_frame, 4),
                     "estimate_full_s": round(per_frame * full, 1), "bytes": len(data)})
        print(f"{preset:>10} {seconds:>8.2f} {per_frame:>8.3f} {per_frame * full:>12.1f} "
              f"{'':>9} {len(data):>9}", flush=True)
    default = next((r for r in rows if r["preset"] == DEFAULT_X264_PRESET), None)
    if default is not None:
        for row in rows:
            row["relative_to_default"] = round(row["estimate_full_s"]
                                               / default["estimate_full_s"], 2)
        print("relative to " + DEFAULT_X264_PRESET + ": " + ", ".join(
            f"{r['preset']} {r['relative_to_default']:g}x" for r in rows))
    load_after = os.getloadavg()
    print(f"load after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": {"cpus": os.cpu_count(), "load_before": load_before,
                                   "load_after": load_after},
                       "width": width, "height": height, "frames_measured": args.frames,
                       "frames_full": full, "threads": args.threads,
                       "default_preset": DEFAULT_X264_PRESET, "rows": rows}, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
