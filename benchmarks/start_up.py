"""Server start to ready on the CPU, per phase: this checkout against an older one, side by side.

Starts ``sgl-omni serve`` (``python -m sglang_omni``) again and again, alternating checkouts and
servers so both see the same machine load, and reads where each second went:

* ``ready_s``: the server process started -> ``/health`` answered 200;
* per stage, from the stage's ready log line (``runtime/stage/process.py``): ``spawn_at_s`` (the
  stage process started, seconds after the server did), ``before_engine_s`` (its own spawn and
  imports until its engine is built) and ``engine_start_s`` (the engine's start: imports, load,
  warm-up); for the hf backend also ``load_s`` (the engine's own "loaded ... in X s") and,
  where the checkout logs it, ``imports_s`` (transformers or diffusers, in the engine's start);
  where the ready line splits the engine's start (``(engine module B s, imports I s, weights W
  s, warm-up U s, other O s; beside them: weights read-ahead R s)``), each part as
  ``part.<name>_s``.

Servers: ``hf`` (``serve --demo``: the hf backend, the tiny random-weight checkpoint, built once
into the cache beforehand) and ``scripted`` (``configs/cpu-scripted.yaml``). Prints the median and
range of ``--runs`` runs per checkout and server, and writes them as JSON with ``--out``.

    .venv/bin/python benchmarks/start_up.py --baseline HEAD~3 --runs 3

``--baseline REV`` archives that revision into ``.baseline/start-<rev>/`` (git archive; the
folder is ignored) and serves it from there with this checkout's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_kit import STAMP, free_port  # noqa: E402

READY = re.compile(r"ready \(backend \w+\) ([\d.]+) s after the process started: ([\d.]+) s "
                   r"to reach the engine, ([\d.]+) s in the engine's start")
#: The ready line's parts (this checkout's): ``(engine module B s, imports I s, ...; beside
#: them: weights read-ahead R s)``.
PARTS = re.compile(r"in the engine's start \((.*\d s)\)$")
PART = re.compile(r"([\w -]+?) ([\d.]+) s$")
LOADED = re.compile(r"hf (?:reasoner|generator): .* loaded on \w+ \([\w.]+\) in ([\d.]+) s")
IMPORTS = re.compile(r"warmed up in [\d.]+ s; imports ([\d.]+) s")
SERVERS = {"hf": ["--demo"], "scripted": ["--config", str(REPO / "configs/cpu-scripted.yaml")]}


def baseline_tree(rev: str) -> Path:
    """``rev`` of this repository unpacked into ``.baseline/start-<sha>/`` (once)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.strip()
    target = REPO / ".baseline" / f"start-{sha}"
    if not (target / "sglang_omni").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def start_once(tree: Path, server: str, log_path: Path, timeout: float) -> dict[str, Any]:
    """Start one server from ``tree``, wait for /health 200, stop it; its phases."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log_file:
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", *SERVERS[server], "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "info"],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=str(tree))
        try:
            ready_s = None
            while time.time() - started < timeout and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        ready_s = time.time() - started
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if ready_s is None:
        raise RuntimeError(f"the {server} server from {tree} did not become ready; see {log_path}")
    figures: dict[str, Any] = {"ready_s": ready_s}
    for line in log_path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if not m or not m.group(2).endswith(" stage"):
            continue
        stage = m.group(2).removesuffix(" stage")
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if ready := READY.search(m.group(3)):
            figures[f"{stage}.spawn_at_s"] = at - float(ready.group(1)) - started
            figures[f"{stage}.before_engine_s"] = float(ready.group(2))
            figures[f"{stage}.engine_start_s"] = float(ready.group(3))
            if parts := PARTS.search(m.group(3)):
                for item in re.split(r", |; beside them: ", parts.group(1)):
                    if part := PART.match(item.strip()):
                        name = part.group(1).replace(" ", "_").replace("-", "_")
                        figures[f"{stage}.part.{name}_s"] = float(part.group(2))
        elif loaded := LOADED.search(m.group(3)):
            figures[f"{stage}.load_s"] = float(loaded.group(1))
            if imports := IMPORTS.search(m.group(3)):
                figures[f"{stage}.imports_s"] = float(imports.group(1))
    return figures


def summary(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per figure: [median, min, max] over the runs."""
    keys = sorted({k for run in runs for k in run}, key=lambda k: (k != "ready_s", k))
    out = {}
    for key in keys:
        values = [run[key] for run in runs if key in run]
        out[key] = [round(statistics.median(values), 2), round(min(values), 2),
                    round(max(values), 2)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a git revision to compare with (e.g. HEAD~3)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--servers", default="hf,scripted", help="of: hf, scripted")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    trees = {"new": REPO}
    if args.baseline:
        trees = {"base": baseline_tree(args.baseline), **trees}
    if "hf" in servers:  # build the demo checkpoint now, not inside a timed start
        subprocess.run([sys.executable, "-c", "from sglang_omni.models.cosmos3 import "
                        "tiny_checkpoint as t; t.cached_tiny_checkpoint()"], check=True,
                       cwd=str(REPO))
    logs = REPO / "outputs" / "start_up"
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {s: [] for s in servers} for name in trees}
    for i in range(args.runs):
        for server in servers:
            for name, tree in trees.items():
                figures = start_once(tree, server, logs / f"{name}_{server}_{i}.log",
                                     args.timeout)
                runs[name][server].append(figures)
                print(f"run {i + 1}/{args.runs} {name:4} {server:8} ready in "
                      f"{figures['ready_s']:.1f} s", flush=True)
    table = {name: {s: summary(r) for s, r in by_server.items()}
             for name, by_server in runs.items()}
    print("\nmedian [min-max] seconds of", args.runs, "runs")
    for server in servers:
        keys = list(table["new"][server])
        print(f"\n{server:28} " + "  ".join(f"{name:>18}" for name in trees))
        for key in keys:
            cells = []
            for name in trees:
                m = table[name][server].get(key)
                cells.append(f"{m[0]:6.2f} [{m[1]:.2f}-{m[2]:.2f}]" if m else " " * 18)
            print(f"{key:28} " + "  ".join(f"{c:>18}" for c in cells))
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "summary": table,
                                        "baseline": args.baseline}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
