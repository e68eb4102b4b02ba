"""Omni's own overhead, the table of issue 28, for this checkout (zero-delay scripted engines).

Usage: python benchmarks/overhead_table.py [--runs 3] [--quick] [--json PATH]

Each run starts ``sgl-omni serve --config configs/cpu-scripted.yaml`` (scripted engines,
``step_time_s`` 0: the engines cost next to nothing, what is measured is Omni) and measures, as a
client over HTTP on the same machine:

* per dispatch p50: sequential ``/generate`` requests of an image then a final answer (three
  dispatches: Reasoner turn, generation, Reasoner turn), each request's latency / 3, median
  (the client's and HTTP's time included; the server process's CPU per such request too);
* server CPU per simple request: the server process's CPU seconds (user + system, its stage
  processes not counted) across sequential simple requests, per request. A simple request is a
  non-streaming ``/v1/chat/completions`` with one short text message (one Reasoner turn, answered
  ``final``);
* worst case: the spec's eight videos of 8 MiB and nine Reasoner turns in one ``/generate``,
  non-streaming: the server process's CPU seconds and the latency, median of 3 requests;
* 16 clients: simple requests from 16 concurrent clients (one asyncio httpx client, the same
  machine), completed requests per second;
* RSS across 1,000 requests: the server process's RSS after 50 warm-up simple requests and after
  1,000 more (sent by the 16 clients), and the change.

With ``--runs N`` it prints each run's figures and the median and range of each row. The first
line names the git commit measured (with ``+dirty`` when the work tree has changes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_kit import REPO, Server  # noqa: E402

MiB = 2**20
SMALL = {"width": 32, "height": 32, "num_frames": 2}
CLIENTS = 16


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short=12", "HEAD") + ("+dirty" if dirty else "")


def generate_body(*entries: dict[str, Any]) -> bytes:
    script = json.dumps(list(entries))
    return json.dumps({"prompt": f"<omni-script>{script}</omni-script>",
                       "stage_params": {"generation": SMALL}}).encode()


IMAGE_FINAL = generate_body({"action": "image", "prompt": "a red cube"},
                            {"action": "final", "text": "done"})
WORST = generate_body(*[{"action": "video", "prompt": f"!size={8 * MiB - 4096} clip {i}"}
                        for i in range(8)], {"action": "final", "text": "compared"})
SIMPLE = json.dumps({"messages": [{"role": "user", "content": "hello"}],
                     "max_tokens": 16}).encode()
JSON = {"content-type": "application/json"}


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def post(client: httpx.Client, url: str, body: bytes) -> None:
    resp = client.post(url, content=body, headers=JSON)
    if resp.status_code != 200:
        raise SystemExit(f"{url}: {resp.status_code} {resp.text[:300]}")


async def clients(url: str, total: int) -> float:
    """``total`` simple requests from CLIENTS concurrent clients; requests per second."""
    left = total
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                resp = await client.post(url, content=SIMPLE, headers=JSON)
                if resp.status_code != 200:
                    raise SystemExit(f"{url}: {resp.status_code} {resp.text[:300]}")

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(CLIENTS)))
        return total / (time.perf_counter() - start)


def one_run(quick: bool) -> dict[str, float]:
    dispatch_requests, simple_requests = (20, 50) if quick else (100, 300)
    worst_requests, rss_requests = (1, 200) if quick else (3, 1000)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log",
                        dict(os.environ))
        try:
            server.wait_ready(180)
            proc = psutil.Process(server.proc.pid)
            chat, generate = f"{server.url}/v1/chat/completions", f"{server.url}/generate"
            with httpx.Client(timeout=600) as client:
                for _ in range(5):  # warm up both paths
                    post(client, generate, IMAGE_FINAL)
                    post(client, chat, SIMPLE)
                per_dispatch = []
                before = cpu_s(proc)
                for _ in range(dispatch_requests):
                    start = time.perf_counter()
                    post(client, generate, IMAGE_FINAL)
                    per_dispatch.append((time.perf_counter() - start) / 3)
                out["per_dispatch_p50_ms"] = statistics.median(per_dispatch) * 1e3
                out["cpu_per_image_final_ms"] = (cpu_s(proc) - before) / dispatch_requests * 1e3

                before = cpu_s(proc)
                for _ in range(simple_requests):
                    post(client, chat, SIMPLE)
                out["cpu_per_simple_ms"] = (cpu_s(proc) - before) / simple_requests * 1e3

                cpu, wall = [], []
                for _ in range(worst_requests):
                    before, start = cpu_s(proc), time.perf_counter()
                    post(client, generate, WORST)
                    wall.append(time.perf_counter() - start)
                    cpu.append(cpu_s(proc) - before)
                out["worst_cpu_s"] = statistics.median(cpu)
                out["worst_latency_s"] = statistics.median(wall)

                for _ in range(50):
                    post(client, chat, SIMPLE)
            rss_before = proc.memory_info().rss / MiB
            out["clients16_req_s"] = asyncio.run(clients(chat, rss_requests))
            rss_after = proc.memory_info().rss / MiB
            out["rss_before_mib"], out["rss_after_mib"] = rss_before, rss_after
            out["rss_change_mib"] = rss_after - rss_before
        finally:
            server.stop()
    return out


ROWS = [("per dispatch p50 (image + final)", "per_dispatch_p50_ms", "ms", 2),
        ("server CPU per simple request (text chat, one turn)", "cpu_per_simple_ms", "ms", 2),
        ("server CPU per image + final /generate", "cpu_per_image_final_ms", "ms", 2),
        ("worst case (8 x 8 MiB videos, 9 turns), server CPU", "worst_cpu_s", "s", 2),
        ("worst case, latency median", "worst_latency_s", "s", 2),
        (f"{CLIENTS} clients, throughput", "clients16_req_s", "req/s", 0),
        ("server RSS before the 1,000 requests", "rss_before_mib", "MiB", 0),
        ("server RSS after them", "rss_after_mib", "MiB", 0),
        ("RSS change across them", "rss_change_mib", "MiB", 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the runs' figures here")
    args = parser.parse_args()
    measured = commit()
    print(f"commit {measured}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{args.runs} run(s){', quick' if args.quick else ''}", flush=True)
    runs = []
    for n in range(args.runs):
        runs.append(one_run(args.quick))
        print(f"run {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()),
              flush=True)
    print(f"\n| workload (Omni at {measured}) | median | range |")
    print("|---|---|---|")
    for label, key, unit, digits in ROWS:
        values = [r[key] for r in runs]
        print(f"| {label} | {statistics.median(values):.{digits}f} {unit} | "
              f"{min(values):.{digits}f}-{max(values):.{digits}f} |")
    if args.json:
        args.json.write_text(json.dumps({"commit": measured, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
