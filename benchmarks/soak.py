"""Soak the server with the reliability suite's mix and report how it holds up over time.

Usage: python benchmarks/soak.py [--duration 600] [--clients 16] [--step-time 0.02] [--direct]

Starts ``sgl-omni serve`` itself with the scripted engines (``configs/cpu-scripted.yaml``; with
``--direct`` also a direct generation server) and runs ``--clients`` threads for ``--duration``
seconds, each picking requests from the mix: interleaved ``/generate`` and chat requests with
1 to 4 generations, streaming and not, streams aborted mid-way, hostile bodies (huge integers,
lone surrogates, deep nesting, wrong types; they must be refused in the JSON error shape), and
with ``--direct`` images and video jobs. Every ``--every`` seconds it prints the requests
served, the errors, and the server's RSS and open fds (server and stage processes); at the end
a markdown table of latencies (p50/p99 per kind), errors by kind (status/type) and resources.

An error is any answer a client should not get: a status or body other than the kind's
expected one (200 well-formed, or a 4xx JSON error for a hostile body), a stream that does not
end with ``[DONE]`` or carries an error event, or a transport failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).parents[1]
UMM_CONFIG = ROOT / "configs" / "cpu-scripted.yaml"
DIRECT_CONFIG = ROOT / "tests" / "direct-scripted.yaml"
SMALL = {"width": 32, "height": 32, "num_frames": 3, "num_inference_steps": 2}
HOSTILE = [
    b'{"prompt":"hi","seed":18446744073709551616}',
    b'{"prompt":"hi","seed":-9223372036854775809}',
    b'{"prompt":"\\ud800"}',
    b'{"prompt":"hi","model":"\\ud800"}',
    b'{"prompt":"hi","seed":' + b"9" * 5000 + b"}",
    b'{"prompt":"hi","stage_params":' + b'{"a":' * 600 + b"1" + b"}" * 600 + b"}",
    b"[" * 5000 + b"]" * 5000,
    b'{"prompt":"hi","stage_params":{"generation":{"width":16384,"height":16384}}}',
    b'{"prompt":"hi","stage_params":{"generation":"x"}}',
    b'{"prompt":["not","a","string"]}',
    b"\xff\xfe",
]


# --- the server ------------------------------------------------------------------------------
class Served:
    """A ``sgl-omni serve`` subprocess on a free port, logging to a temp file."""

    def __init__(self, config: Path, *flags: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="omni-soak-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", "--config", str(config),
             "--port", str(self.port), *flags],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited at startup; log: {self.log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"the server did not become ready in 120 s; log: {self.log.name}")

    def resources(self) -> tuple[float, int, int]:
        """(server RSS in MiB, open fds of the server and its stages, processes)."""
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
            rss = root.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            return 0.0, 0, 0
        fds = 0
        for p in procs:
            try:
                fds += p.num_fds()
            except psutil.NoSuchProcess:
                pass
        return rss, fds, len(procs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(5)


# --- the mix ---------------------------------------------------------------------------------
def script_prompt(rng: random.Random, tag: str) -> str:
    kinds = [rng.choice(["image", "video"]) for _ in range(rng.randint(1, 4))]
    entries: list[Any] = [{"action": k, "prompt": f"{k} {tag}.{i}"} for i, k in enumerate(kinds)]
    entries.append({"action": "final", "text": f"done {tag}"})
    return f"<omni-script>{json.dumps(entries)}</omni-script> go"


def sse_problem(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.startswith(("data:", "event:"))]
    if not lines or lines[-1] != "data: [DONE]":
        return "stream-not-done"
    if "event: error" in lines or any(line.startswith('data: {"error"') for line in lines):
        return "stream-error"
    return None


def error_kind(resp: httpx.Response) -> str:
    try:
        error = resp.json()["error"]
        return f"{resp.status_code} {error['type']}"
    except (ValueError, KeyError, TypeError):
        return f"{resp.status_code} non-json"


Op = Callable[[httpx.Client, random.Random, str], str | None]


def interleaved(route: str, stream: bool) -> Op:
    def op(http: httpx.Client, rng: random.Random, tag: str) -> str | None:
        prompt = script_prompt(rng, tag)
        body: dict[str, Any] = {"prompt": prompt} if route == "/generate" else {
            "messages": [{"role": "user", "content": prompt}]}
        body |= {"stream": stream, "stage_params": {"generation": SMALL}}
        resp = http.post(URLS["umm"] + route, json=body)
        if resp.status_code != 200:
            return error_kind(resp)
        return sse_problem(resp.text) if stream else None
    return op


def aborted(http: httpx.Client, rng: random.Random, tag: str) -> str | None:
    body = {"prompt": script_prompt(rng, tag), "stream": True,
            "stage_params": {"generation": SMALL}}
    with http.stream("POST", URLS["umm"] + "/generate", json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            return error_kind(resp)
        if rng.random() < 0.5:  # else abort right after the headers, in a Reasoner turn
            for line in resp.iter_lines():
                if line.startswith("event: segment"):
                    break  # abort in a later turn or generation
    return None  # leaving the block closes the connection mid-stream


def hostile(http: httpx.Client, rng: random.Random, tag: str) -> str | None:
    route = rng.choice(["/generate", "/v1/chat/completions"])
    resp = http.post(URLS["umm"] + route, content=rng.choice(HOSTILE),
                     headers={"Content-Type": "application/json"})
    if resp.status_code in (400, 413, 415):
        kind = error_kind(resp)
        return None if "non-json" not in kind else kind
    return error_kind(resp)


def direct_image(http: httpx.Client, rng: random.Random, tag: str) -> str | None:
    resp = http.post(URLS["direct"] + "/v1/images/generations",
                     json={"prompt": f"image {tag}", "size": "32x32", "num_inference_steps": 2})
    return None if resp.status_code == 200 else error_kind(resp)


def direct_video(http: httpx.Client, rng: random.Random, tag: str) -> str | None:
    resp = http.post(URLS["direct"] + "/v1/videos", json={
        "prompt": f"clip {tag}", "size": "32x32", "num_frames": 3, "num_inference_steps": 2})
    if resp.status_code != 200:
        return error_kind(resp)
    video_id = resp.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = http.get(f"{URLS['direct']}/v1/videos/{video_id}").json()
        if job["status"] in ("completed", "failed"):
            http.delete(f"{URLS['direct']}/v1/videos/{video_id}")
            return None if job["status"] == "completed" else "video-job-failed"
        time.sleep(0.05)
    return "video-job-timeout"


URLS: dict[str, str] = {}
MIX: dict[str, tuple[float, Op]] = {
    "generate": (3, interleaved("/generate", False)),
    "generate-stream": (3, interleaved("/generate", True)),
    "chat": (2, interleaved("/v1/chat/completions", False)),
    "chat-stream": (2, interleaved("/v1/chat/completions", True)),
    "aborted-stream": (2, aborted),
    "hostile": (2, hostile),
}
DIRECT_MIX: dict[str, tuple[float, Op]] = {"image": (1, direct_image),
                                           "video-job": (1, direct_video)}


# --- the run ---------------------------------------------------------------------------------
class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter[tuple[str, str]] = Counter()

    def add(self, kind: str, seconds: float, error: str | None) -> None:
        with self.lock:
            self.latency[kind].append(seconds)
            if error is not None:
                self.errors[kind, error] += 1

    def totals(self) -> tuple[int, int]:
        with self.lock:
            return sum(map(len, self.latency.values())), sum(self.errors.values())


def worker(index: int, mix: dict[str, tuple[float, Op]], stats: Stats, until: float) -> None:
    rng = random.Random(index)
    names = list(mix)
    weights = [mix[n][0] for n in names]
    count = 0
    with httpx.Client(timeout=120) as http:
        while time.monotonic() < until:
            kind = rng.choices(names, weights)[0]
            start = time.perf_counter()
            try:
                error = mix[kind][1](http, rng, f"{index}.{count}")
            except httpx.HTTPError as exc:
                error = f"transport {type(exc).__name__}"
            except (ValueError, KeyError, TypeError) as exc:
                error = f"malformed {type(exc).__name__}"
            stats.add(kind, time.perf_counter() - start, error)
            count += 1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load")
    parser.add_argument("--clients", type=int, default=16, help="concurrent client threads")
    parser.add_argument("--step-time", type=float, default=0.02,
                        help="scripted generation seconds per denoising step")
    parser.add_argument("--every", type=float, default=10, help="seconds between report lines")
    parser.add_argument("--direct", action="store_true",
                        help="also start a direct generation server and add its routes")
    args = parser.parse_args()

    flags = ("--generation.factory.step_time_s", str(args.step_time),
             "--orchestrator.factory.max_active", str(max(32, 2 * args.clients)),
             "--orchestrator.factory.timeout_s", "600", "--log-level", "warning")
    servers = {"umm": Served(UMM_CONFIG, *flags)}
    mix = dict(MIX)
    if args.direct:
        servers["direct"] = Served(DIRECT_CONFIG, *flags[:2], "--log-level", "warning")
        mix |= DIRECT_MIX
    URLS.update({name: s.url for name, s in servers.items()})
    stats = Stats()
    samples: list[tuple[float, float, int]] = []
    start = time.monotonic()
    until = start + args.duration
    threads = [threading.Thread(target=worker, args=(i, mix, stats, until), daemon=True)
               for i in range(args.clients)]
    try:
        print(f"soak: {args.clients} clients for {args.duration:g} s against {URLS} "
              f"(step_time_s {args.step_time:g})", flush=True)
        for thread in threads:
            thread.start()
        next_line = start
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            if now >= next_line:
                rss, fds, procs = servers["umm"].resources()
                samples.append((rss, fds, procs))
                served, errors = stats.totals()
                print(f"t={now - start:6.1f}s served {served:6d} errors {errors:4d} "
                      f"server RSS {rss:7.1f} MiB fds {fds:4d} processes {procs}", flush=True)
                next_line += args.every
            time.sleep(0.2)
        rss, fds, procs = servers["umm"].resources()
        samples.append((rss, fds, procs))
        healthy = httpx.get(URLS["umm"] + "/health", timeout=5).status_code == 200
    finally:
        for server in servers.values():
            server.stop()
    elapsed = time.monotonic() - start
    served, errors = stats.totals()
    print(f"\n## Soak: {args.clients} clients, {elapsed:.0f} s, step_time_s {args.step_time:g}\n")
    print("| kind | requests | errors | p50 latency (s) | p99 latency (s) |")
    print("|---|---:|---:|---:|---:|")
    for kind, values in sorted(stats.latency.items()):
        kind_errors = sum(n for (k, _), n in stats.errors.items() if k == kind)
        print(f"| {kind} | {len(values)} | {kind_errors} | {pct(values, 0.5):.3f} "
              f"| {pct(values, 0.99):.3f} |")
    all_values = [v for values in stats.latency.values() for v in values]
    print(f"| **all** | **{served}** | **{errors}** | {pct(all_values, 0.5):.3f} "
          f"| {pct(all_values, 0.99):.3f} |")
    print("\n| error (kind: status type) | count |\n|---|---:|")
    for (kind, error), count in sorted(stats.errors.items()):
        print(f"| {kind}: {error} | {count} |")
    if not stats.errors:
        print("| none | 0 |")
    rss_values = [s[0] for s in samples]
    fd_values = [s[1] for s in samples]
    print("\n| resource | start | end | max |\n|---|---:|---:|---:|")
    print(f"| server RSS (MiB) | {rss_values[0]:.1f} | {rss_values[-1]:.1f} "
          f"| {max(rss_values):.1f} |")
    print(f"| open fds (server + stages) | {fd_values[0]} | {fd_values[-1]} | {max(fd_values)} |")
    print(f"\nthroughput {served / elapsed:.1f} requests/s; server healthy at the end: {healthy}")
    for server in servers.values():
        if errors or not healthy:
            print(f"server log: {server.log.name}")
        else:
            os.unlink(server.log.name)


if __name__ == "__main__":
    main()
