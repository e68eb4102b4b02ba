"""Where a stage's start-up goes before its engine is ready, import by import: each stage
(Reasoner, generation) of a backend is started the way its process starts it, in a fresh
interpreter under ``python -X importtime``, and the imports are summed per top-level package.

Phases, in the order a stage process runs them:

* ``stage_module_s``: importing ``sglang_omni.runtime.stage.process`` (what the spawned process
  imports before it reads its spec);
* ``engine_module_s``: ``build_engine`` (the backend's engine module and its constructor);
* ``engine_start_s``: ``await engine.start()`` (hf: the libraries, the checkpoint's load and, on a
  GPU, the warm-up), with the engine's own parts where it reports them (``startup_parts``).

Per package: the seconds spent running that package's modules (``-X importtime``'s self time,
summed over its modules), largest first; ``imports_s`` is their sum. Where the time is spent
importing a library that no Omni code asked for by name (a top-level model-zoo scan) the package
list shows it.

    .venv/bin/python benchmarks/stage_imports.py --runs 3 \
        --out benchmarks/results/stage_imports_cpu.json

The hf stages load the tiny random-weight checkpoint (``serve --demo``'s) on the CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")
#: Runs in the fresh interpreter: a stage's steps, timed, then its figures as one JSON line.
PROBE = """
import time
t0 = time.perf_counter()
import sglang_omni.runtime.stage.process
t1 = time.perf_counter()
import asyncio, json
from sglang_omni.contract.job import EngineSpec
from sglang_omni.engines.base import build_engine
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter
spec = EngineSpec(stage={stage!r}, role={stage!r}, backend={backend!r}, model_path={path!r},
                  gpu=None, gpu_memory_fraction=None, factory={{}}, engine={{}},
                  umm_adapter=Cosmos3UMMAdapter)
t2 = time.perf_counter()
engine = build_engine(spec)
t3 = time.perf_counter()
asyncio.run(engine.start())
t4 = time.perf_counter()
report = getattr(engine, "startup_parts", None)
parts, beside = report() if callable(report) else ({{}}, {{}})
parts.update({{name + " (beside)": s for name, s in beside.items()}})
print("PROBE " + json.dumps({{"stage_module_s": t1 - t0, "engine_module_s": t3 - t2,
                             "engine_start_s": t4 - t3, "engine_parts": parts}}))
"""


def profile_once(backend: str, stage: str, checkpoint: str | None,
                 tree: Path = REPO) -> dict[str, Any]:
    """One stage's start in a fresh interpreter, importing ``tree``'s ``sglang_omni``: its
    phases and its imports by package."""
    code = PROBE.format(stage=stage, backend=backend, path=checkpoint)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=str(tree),
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} {stage}: exit {done.returncode}\n{done.stderr[-3000:]}")
    probe = next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))
    figures: dict[str, Any] = json.loads(probe[len("PROBE "):])
    by_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        m = LINE.match(line)
        if m:
            top = m.group(4).split(".")[0]
            by_package[top] = by_package.get(top, 0.0) + int(m.group(1)) / 1e6
    figures["imports_s"] = sum(by_package.values())
    figures["modules"] = sum(1 for line in done.stderr.splitlines() if LINE.match(line))
    figures["by_package_s"] = dict(sorted(by_package.items(), key=lambda kv: -kv[1]))
    return figures


def summary(runs: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Medians over the runs (the packages: the ``top`` largest by median)."""
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    out: dict[str, Any] = {k: med([r[k] for r in runs]) for k in
                           ("stage_module_s", "engine_module_s", "engine_start_s", "imports_s",
                            "modules")}
    parts = sorted({k for r in runs for k in r["engine_parts"]})
    out["engine_parts"] = {k: med([r["engine_parts"][k] for r in runs if k in r["engine_parts"]])
                           for k in parts}
    packages = {k for r in runs for k in r["by_package_s"]}
    medians = {k: med([r["by_package_s"].get(k, 0.0) for r in runs]) for k in packages}
    out["by_package_s"] = dict(sorted(medians.items(), key=lambda kv: -kv[1])[:top])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="hf,scripted")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="packages to list per stage")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--tree", type=Path, default=REPO,
                        help="the checkout whose sglang_omni to profile (default: this one)")
    args = parser.parse_args()
    checkpoint = subprocess.run(
        [sys.executable, "-c", "from sglang_omni.models.cosmos3 import tiny_checkpoint as t; "
         "print(t.cached_tiny_checkpoint())"], cwd=str(REPO), check=True, capture_output=True,
        text=True).stdout.strip()
    table: dict[str, Any] = {}
    for backend in args.backends.split(","):
        for stage in ("reasoner", "generation"):
            runs = [profile_once(backend, stage, checkpoint if backend == "hf" else None,
                                 args.tree.resolve()) for _ in range(args.runs)]
            table[f"{backend}/{stage}"] = summary(runs, args.top)
            s = table[f"{backend}/{stage}"]
            print(f"\n{backend} {stage} (median of {args.runs}): stage module "
                  f"{s['stage_module_s']:.2f} s, engine module {s['engine_module_s']:.2f} s, "
                  f"engine start {s['engine_start_s']:.2f} s {s['engine_parts']}; imports "
                  f"{s['imports_s']:.2f} s in all, {s['modules']:.0f} modules")
            for name, seconds in s["by_package_s"].items():
                print(f"  {name:24} {seconds:6.2f} s")
    if args.out:
        args.out.write_text(json.dumps({"runs": args.runs, "tree": str(args.tree),
                                        "stages": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
