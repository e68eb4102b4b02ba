"""How long a large request body holds up everyone else's requests.

Usage: python benchmarks/big_bodies.py [--images-mb 8,30,60x3] [--repeat 3]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``), then for each
case sends one chat request whose images are inline base64 ``data:`` URLs (``30`` is one image
of 30 MB, ``60x3`` three of 60 MB: a 240 MB body the server reads, checks and refuses because
the history exceeds its retained-bytes budget), while a second client asks ``GET /health`` every
10 ms. Everything the server does with the body on its event loop, or on a thread that holds
the GIL, delays those health answers: the table gives the slowest and the 99th-percentile
``/health`` answer during each request (and with no large request, first), and the large
request's own status and time. Figures are the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from media_kit import padded_png  # noqa: E402
from serve_kit import REPO, Server  # noqa: E402

PING_S = 0.01


class Pinger(threading.Thread):
    """Ask ``/health`` every :data:`PING_S` seconds; ``window()`` gives the latencies since
    the last call."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                client.get(f"{self.url}/health")
                self.latencies.append(time.perf_counter() - started)
                time.sleep(PING_S)

    def window(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken


def chat_body(image_mb: int, count: int) -> bytes:
    # a valid PNG (admission parses inline media), of random bytes in the bulk
    payload = base64.b64encode(padded_png(image_mb * 1024 * 1024)).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{payload}"}}
    return json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"}, *[part] * count]}], "max_tokens": 8}).encode()


def parse_case(text: str) -> tuple[int, int]:
    size, _, count = text.partition("x")
    return int(size), int(count or 1)


def measure(url: str, pinger: Pinger, body: bytes | None) -> dict[str, float]:
    pinger.window()
    started = time.perf_counter()
    status = 0
    if body is None:
        time.sleep(2.0)
    else:
        status = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=300,
                            headers={"content-type": "application/json"}).status_code
    took = time.perf_counter() - started
    time.sleep(0.2)  # the last delayed ping answers
    seen = sorted(pinger.window())
    return {"status": status, "took_s": took, "max_ms": seen[-1] * 1e3,
            "p99_ms": seen[int(0.99 * (len(seen) - 1))] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images-mb", default="8,30,60x3",
                        help="cases: MB per image, xN for N images (default 8,30,60x3)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = [parse_case(c) for c in args.images_mb.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log",
                        dict(os.environ))
        try:
            server.wait_ready(120)
            pinger = Pinger(server.url)
            rows: list[tuple[str, int, list[dict[str, float]]]] = []
            rows.append(("none", 0, [measure(server.url, pinger, None)
                                     for _ in range(args.repeat)]))
            for size, count in cases:
                body = chat_body(size, count)
                runs = [measure(server.url, pinger, body) for _ in range(args.repeat)]
                rows.append((f"{count} x {size} MB", len(body), runs))
            pinger.stop.set()
        finally:
            server.stop()
    print("| large request | body MB | status | its time s | /health max ms | /health p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, size, runs in rows:
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        status = "-" if not size else int(med["status"])
        took = "-" if not size else f"{med['took_s']:.2f}"
        print(f"| {name} | {size / 2**20:.0f} | {status} | {took} | {med['max_ms']:.0f} | "
              f"{med['p99_ms']:.0f} |")


if __name__ == "__main__":
    main()
