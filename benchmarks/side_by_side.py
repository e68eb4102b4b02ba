"""Print the README's "where an interleaved request's time goes" rows from serve_gpu.py JSON
files: the median and range of each figure over ``before_*.json`` and ``now_*.json`` in a
folder (one side-by-side GPU session, see benchmarks/README.md).

    python benchmarks/side_by_side.py benchmarks/results/wave3/media_once
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any


def model_s(run: dict[str, Any]) -> float:
    """The timeline's model seconds; for code without a timeline, its engines' times."""
    first = run["interleaved_first"]
    if first.get("model_s") is not None:
        return float(first["model_s"])
    return sum(t["s"] for t in first["reasoner_turns"]) + \
        sum(g["s"] for g in first["generations"] if g.get("s") is not None)


def segment_after_generation(run: dict[str, Any]) -> float:
    video = run["video"]
    return video["video_segment_s"] - video["reasoner_turns"][0]["s"] - \
        video["generations"][0]["s"]


def ninth_over_first(run: dict[str, Any]) -> float:
    turns = [t["s"] for t in run["interleaved_first"]["reasoner_turns"]]
    return turns[-1] / turns[0] - 1.0


ROWS: list[tuple[str, str, Callable[[dict[str, Any]], float]]] = [
    ("end to end", "{:.1f} s", lambda r: r["interleaved_first"]["e2e_s"]),
    ("model time", "{:.1f} s", model_s),
    ("wall / model time", "{:.2f}x", lambda r: r["interleaved_first"]["e2e_s"] / model_s(r)),
    ("time that is not the model", "{:.1f} s",
     lambda r: r["interleaved_first"]["e2e_s"] - model_s(r)),
    ("last Reasoner turn over the first", "{:+.0%}", ninth_over_first),
    ("1280x720 video: segment after its generation", "{:.2f} s", segment_after_generation),
    ("Omni's own CPU per interleaved request", "{:.2f} s",
     lambda r: r["interleaved_first"]["cpu_s"]["omni"]),
    ("server start to ready", "{:.1f} s", lambda r: r["server_start_s"]),
]


def summary(runs: list[dict[str, Any]], figure: Callable[[dict[str, Any]], float],
            fmt: str) -> str:
    values = [figure(r) for r in runs]
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-" \
           f"{fmt.format(max(values))}, {len(values)} runs)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    sides = {side: [json.loads(p.read_text()) for p in sorted(args.folder.glob(f"{side}_*.json"))]
             for side in ("before", "now")}
    print("| | before | now |\n|---|---|---|")
    for name, fmt, figure in ROWS:
        print(f"| {name} | {summary(sides['before'], figure, fmt)} | "
              f"{summary(sides['now'], figure, fmt)} |")


if __name__ == "__main__":
    main()
