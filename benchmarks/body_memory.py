"""How much memory the server takes to handle one large accepted body, as a multiple of its size.

Usage: python benchmarks/body_memory.py [--body-mb 150] [--parts 3] [--repeat 3] [--routes NAMES]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``) and sends,
one at a time, bodies of about ``--body-mb`` MB whose bulk is inline media split into
``--parts`` base64 items (each under the 64 MiB one-file limit): ``/generate`` with ``images``
and with ``videos``, and ``/v1/chat/completions`` with ``image_url`` and ``video_url`` data URLs.
Before each request, once the server's RSS has settled, its peak RSS is reset
(``/proc/PID/clear_refs``, 5); after its answer the peak (``VmHWM``) less the RSS before it is
the memory the request took. Prints that growth divided by the body's size, median and range of
``--repeat`` runs per route (target: under 1.5).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from media_kit import padded_mp4, padded_png  # noqa: E402
from serve_kit import REPO, Server  # noqa: E402

MB = 10**6
MiB = 2**20
#: The interleaved pipeline holds a request's history within max_retained_bytes (128 MiB by
#: default): raised so that the body's media are accepted.
RETAIN_ALL = ("--stages.orchestrator.factory.max_retained_bytes", str(2**30))


def payloads(body_mb: int, parts: int, make: Callable[[int], bytes]) -> list[str]:
    """``parts`` base64 payloads of valid media (``make(size)``: mostly random bytes, see
    ``media_kit``) totalling ``body_mb`` MB of base64 text."""
    size = body_mb * MB // parts * 3 // 4
    return [base64.b64encode(make(size)).decode() for _ in range(parts)]


def bodies(body_mb: int, parts: int) -> dict[str, tuple[str, bytes]]:
    """Route name -> (path, JSON body)."""
    images = [f"data:image/png;base64,{p}" for p in payloads(body_mb, parts, padded_png)]
    videos = [f"data:video/mp4;base64,{p}" for p in payloads(body_mb, parts, padded_mp4)]

    def chat(kind: str, urls: list[str]) -> bytes:
        content = [{"type": "text", "text": "describe"},
                   *({"type": kind, kind: {"url": u}} for u in urls)]
        return json.dumps({"messages": [{"role": "user", "content": content}],
                           "max_tokens": 8}).encode()

    return {
        "/generate images": ("/generate", json.dumps(
            {"prompt": "describe", "images": images}).encode()),
        "/generate videos": ("/generate", json.dumps(
            {"prompt": "describe", "videos": videos}).encode()),
        "chat image_url": ("/v1/chat/completions", chat("image_url", images)),
        "chat video_url": ("/v1/chat/completions", chat("video_url", videos)),
    }


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def settle(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until the server's RSS has stayed within 1 MiB for a second (what the last request
    held is given back after its answer)."""
    deadline = time.monotonic() + timeout_s
    last = status_kib(pid, "VmRSS")
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = status_kib(pid, "VmRSS")
        if abs(now - last) < 1024:
            return
        last = now


def measure(server: Server, path: str, body: bytes) -> float:
    """Peak RSS growth of the server process during one request, as a multiple of the body."""
    pid = server.proc.pid
    settle(pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_kib(pid, "VmRSS")
    resp = httpx.post(f"{server.url}{path}", content=body, timeout=600,
                      headers={"content-type": "application/json"})
    if resp.status_code != 200:
        raise SystemExit(f"{path}: {resp.status_code} {resp.text[:300]}")
    peak = status_kib(pid, "VmHWM")
    return (peak - before) * 1024 / len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-mb", type=int, default=150)
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--routes", default="",
                        help="comma-separated route names to run (default: all)")
    args = parser.parse_args()
    cases = bodies(args.body_mb, args.parts)
    if args.routes:
        cases = {k: v for k, v in cases.items() if k in args.routes.split(",")}
    results: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log",
                        dict(os.environ), args=RETAIN_ALL)
        try:
            server.wait_ready(120)
            for run in range(args.repeat):
                for name, (path, body) in cases.items():
                    results[name].append(measure(server, path, body))
                    print(f"run {run + 1} {name}: {results[name][-1]:.2f}x", flush=True)
        except BaseException:
            print((Path(tmp) / "server.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            server.stop()
            if os.environ.get("SHOW_LOG"):
                print((Path(tmp) / "server.log").read_text()[-5000:])
    print(f"\n| route | body MB | peak RSS growth / body size, median (range) of {args.repeat} |")
    print("|---|---|---|")
    for name, runs in results.items():
        size = len(cases[name][1]) / MB
        print(f"| {name} | {size:.0f} | {statistics.median(runs):.2f}x "
              f"({min(runs):.2f}-{max(runs):.2f}) |")


if __name__ == "__main__":
    main()
