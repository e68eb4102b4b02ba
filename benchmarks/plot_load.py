"""Draw ``load_gpu.py``'s latencies by arrival rank, one panel per N, old and new side by side,
as a hand-written SVG (no plotting library is a dependency).

    python benchmarks/plot_load.py --old results/load_one_gpu_baseline.json \\
        --new results/load_one_gpu.json --out results/load_one_gpu.svg

Each panel: one pair of bars per request in arrival order (old grey, new blue), the height its
latency (a request that was not answered 200 is drawn hollow); the dashed line is the new
run's request alone (N = 1). ``--key with_deadline`` draws the deadline rounds instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PANEL_W, PANEL_H, PAD, TOP, BOTTOM = 220, 220, 40, 40, 40
COLORS = {"old": "#9a9a9a", "new": "#2f6db5"}


def _bars(n: int, rounds: dict[str, dict[str, Any]], x0: float, scale: float,
          base_y: float) -> list[str]:
    out = []
    width = (PANEL_W - 2 * 10) / max(n, 1)
    bar = width / (len(rounds) + 1)
    for rank in range(n):
        for k, (side, result) in enumerate(rounds.items()):
            latencies = result.get("latencies_s") or []
            if rank >= len(latencies) or latencies[rank] is None:
                continue
            ok = (result.get("statuses") or [200] * n)[rank] == 200
            h = latencies[rank] * scale
            x = x0 + 10 + rank * width + (k + 0.5) * bar
            fill = COLORS[side] if ok else "none"
            out.append(f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar:.1f}" '
                       f'height="{h:.1f}" fill="{fill}" stroke="{COLORS[side]}">'
                       f'<title>{side}, request {rank + 1}: {latencies[rank]:.1f} s</title>'
                       f'</rect>')
        out.append(f'<text x="{x0 + 10 + (rank + 0.5) * width:.1f}" y="{base_y + 14}" '
                   f'font-size="10" text-anchor="middle">{rank + 1}</text>')
    return out


def svg(sides: dict[str, dict[str, Any]], key: str) -> str:
    ns = sorted({int(n) for figures in sides.values() for n in figures.get(key, {})})
    most = max((v for figures in sides.values() for r in figures.get(key, {}).values()
                for v in r.get("latencies_s") or [] if v is not None), default=1.0)
    scale = (PANEL_H - TOP - BOTTOM) / most
    width = PAD + len(ns) * (PANEL_W + PAD)
    base_y = PANEL_H - BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 30}" '
             f'font-family="sans-serif">',
             f'<text x="{PAD}" y="16" font-size="13">Latency by arrival rank ({key}); '
             + " ".join(f'<tspan fill="{COLORS[s]}">&#9632; {s}</tspan>' for s in sides)
             + "</text>"]
    alone = sides.get("new", {}).get("alone_s")
    for i, n in enumerate(ns):
        x0 = PAD + i * (PANEL_W + PAD)
        parts.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP - 8}" font-size="12" '
                     f'text-anchor="middle">N = {n}</text>')
        parts.append(f'<line x1="{x0}" y1="{base_y}" x2="{x0 + PANEL_W}" y2="{base_y}" '
                     'stroke="black"/>')
        parts.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{base_y}" stroke="black"/>')
        parts.append(f'<text x="{x0 - 4}" y="{TOP + 4}" font-size="10" text-anchor="end">'
                     f'{most:.0f} s</text>')
        parts.append(f'<text x="{x0 - 4}" y="{base_y}" font-size="10" text-anchor="end">0</text>')
        rounds = {side: figures[key][str(n)] for side, figures in sides.items()
                  if str(n) in figures.get(key, {})}
        parts += _bars(n, rounds, x0, scale, base_y)
        if alone:
            y = base_y - alone * scale
            parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" '
                         'stroke="black" stroke-dasharray="4 3"><title>new, alone: '
                         f'{alone:.1f} s</title></line>')
        parts.append(f'<text x="{x0 + PANEL_W / 2}" y="{base_y + 28}" font-size="10" '
                     'text-anchor="middle">arrival rank</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new", type=Path, required=True, help="load_gpu.py JSON, this code")
    parser.add_argument("--old", type=Path, help="load_gpu.py JSON of the baseline")
    parser.add_argument("--key", default="by_n", choices=["by_n", "with_deadline"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sides = {}
    if args.old:
        sides["old"] = json.loads(args.old.read_text())
    sides["new"] = json.loads(args.new.read_text())
    args.out.write_text(svg(sides, args.key))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
