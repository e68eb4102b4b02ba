"""``benchmarks/load_gpu.py`` (N requests at once, with and without a deadline) runs against the
scripted engines on the CPU and writes the figures the H200 run reports; its plot script draws
them. The figures themselves belong to the benchmark, not to this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PER_N = ("latencies_s", "oldest_over_alone", "mean_latency_s", "makespan_s", "gpu_busy_pct",
         "statuses", "in_arrival_order", "requests")


@pytest.mark.server  # the script starts sgl-omni serve itself
@pytest.mark.timeout(600)
def test_the_load_script_runs_on_the_scripted_engines_and_writes_its_figures(
        tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "benchmarks/load_gpu.py", "--config", "configs/cpu-scripted.yaml",
         "--quick", "--ns", "1,2", "--deadline-s", "600", "--scripted-turn-s", "0.05",
         "--scripted-step-s", "0.02", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["gpus"] == [] and figures["server_start_s"] > 0
    for key in ("by_n", "with_deadline"):
        assert sorted(figures[key]) == ["1", "2"]
        for n, result in figures[key].items():
            assert set(PER_N) <= set(result)
            assert len(result["latencies_s"]) == int(n)
            assert result["statuses"] == [200] * int(n)
            assert result["gpu_busy_pct"] is None  # no GPU here
            for request in result["requests"]:
                assert request["segments"] == 3  # image, video, image: the README's shape
                assert request["first_segment_s"] is not None
                assert "generation.wait" in request["waits_s"]
    assert figures["by_n"]["1"]["oldest_over_alone"] == 1.0
    plot = tmp_path / "load.svg"
    drawn = subprocess.run([sys.executable, "benchmarks/plot_load.py", "--new", str(out),
                            "--old", str(out), "--out", str(plot)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    svg = plot.read_text()
    assert svg.startswith("<svg") and "N = 2" in svg and "old" in svg and "new" in svg
