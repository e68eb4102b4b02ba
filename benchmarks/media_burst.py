"""The 'media burst' fault of ``faults.py``: many chat requests at once, each naming remote
images just under the per-fetch limit.

Usage: python benchmarks/faults.py --faults "media burst" [--burst 20] [--burst-parts 4]
                                   [--burst-image-mib 63.9] [--burst-out PATH]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``) and
``--allowed-media-domain 127.0.0.1``, and a loopback media host serving valid PNGs padded to
``--burst-image-mib`` MiB (just under ``media_url_max_file_size_mb``, 64). Then sends
``--burst`` ``/v1/chat/completions`` requests at once, each naming ``--burst-parts`` distinct
images, and records:

* the answers by status (a 503 with or without ``Retry-After``), and how many the media host
  was asked for (a refused request must fetch nothing);
* the peak RSS of the server process and of each stage process (sampled every 50 ms), and the
  peak of ``sgl_omni_client_media_bytes`` (the client media budget);
* the stage restarts, and whether ``/health`` ever left ``ok`` (a stage killed as stalled);
* whether the server serves a plain request afterwards.

It prints a summary and writes it as JSON (``--burst-out``, by default
``benchmarks/results/media_burst.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
UMM_CONFIG = ROOT / "configs" / "cpu-scripted.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "media_burst.json"
MiB = 2**20
ANSWER_WITHIN_S = 600.0


def padded_png(size: int) -> bytes:
    """A valid 4x4 PNG of exactly ``size`` bytes: an ancillary chunk decoders skip pads it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack("!I", len(data)) + kind + data + \
            struct.pack("!I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    head = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack("!IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
    pixels = chunk(b"IDAT", zlib.compress(b"".join(b"\0" + b"\x80" * 12 for _ in range(4))))
    end = chunk(b"IEND", b"")
    pad = size - len(head) - len(pixels) - len(end) - 12
    return head + chunk(b"omPd", b"\0" * pad) + pixels + end


@contextmanager
def media_host(image: bytes) -> Iterator[tuple[int, list[str]]]:
    """A loopback host answering every GET with ``image``; yields (port, paths asked for)."""
    asked: list[str] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            with lock:
                asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(image)))
            self.end_headers()
            try:
                view = memoryview(image)
                for at in range(0, len(image), MiB):
                    self.wfile.write(view[at:at + MiB])
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield server.server_address[1], asked
    finally:
        server.shutdown()
        server.server_close()


class Sampler:
    """Peak RSS of the server and of each stage (by name), the budget gauge's peak, and
    whether ``/health`` left ok, every 50 ms."""

    def __init__(self, url: str, server: psutil.Process) -> None:
        self.url, self.server = url, server
        self.peak: dict[str, int] = {}
        self.budget_peak = 0.0
        self.health_not_ok: list[str] = []
        self.stop = threading.Event()
        self.client = httpx.Client(timeout=10)
        self._names = self._stage_pids()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _stage_pids(self) -> dict[int, str]:
        stages = self.client.get(f"{self.url}/health").json()["stages"]
        return {int(info["pid"]): name for name, info in stages.items()}

    def _run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            self._sample()
            if tick % 4 == 0:
                self._poll_http()
            tick += 1
            time.sleep(0.05)

    def _sample(self) -> None:
        self._note("server", self.server)
        try:
            for child in self.server.children(recursive=True):
                self._note(self._names.get(child.pid, "stage children"), child)
        except psutil.Error:
            pass

    def _note(self, name: str, proc: psutil.Process) -> None:
        try:
            rss = proc.memory_info().rss
        except psutil.Error:
            return
        self.peak[name] = max(self.peak.get(name, 0), rss)

    def _poll_http(self) -> None:
        try:
            health = self.client.get(f"{self.url}/health")
            if health.status_code != 200:
                self.health_not_ok.append(health.json().get("status", str(health.status_code)))
            self.budget_peak = max(self.budget_peak, gauge(self.client, self.url,
                                                           "sgl_omni_client_media_bytes"))
        except (httpx.HTTPError, ValueError):
            self.health_not_ok.append("no answer")

    def close(self) -> None:
        self.stop.set()
        self._thread.join()


def gauge(client: httpx.Client, url: str, name: str) -> float:
    total = 0.0
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_server(port: int) -> tuple[subprocess.Popen, Any]:
    log = tempfile.NamedTemporaryFile(prefix="omni-burst-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_omni", "serve", "--config", str(UMM_CONFIG),
         "--port", str(port), "--allowed-media-domain", "127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited; log: {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc, log
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server did not become ready; log: {log.name}")


def stage_lines(log: Path) -> list[str]:
    """The server log's lines about stage processes failing (a stall, an exit, a restart)."""
    words = ("stalled", "exited", "heartbeat", "restart", "killed")
    return [line[:300] for line in log.read_text(errors="replace").splitlines()
            if any(w in line for w in words)][:20]


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def chat_body(port: int, request: int, parts: int) -> dict[str, Any]:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    content: list[dict[str, Any]] = [{"type": "text",
                                      "text": f"<omni-script>{script}</omni-script>"}]
    content += [{"type": "image_url",
                 "image_url": {"url": f"http://127.0.0.1:{port}/img/{request}-{k}.png"}}
                for k in range(parts)]
    return {"messages": [{"role": "user", "content": content}]}


def run_burst(requests: int = 20, parts: int = 4, image_mib: float = 63.9,
              out: Path = DEFAULT_OUT) -> dict[str, Any]:
    """Run the fault once; the summary (also written to ``out`` as JSON)."""
    image = padded_png(int(image_mib * MiB))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc, log = start_server(port)
    try:
        with media_host(image) as (host_port, asked):
            server = psutil.Process(proc.pid)
            client = httpx.Client(timeout=ANSWER_WITHIN_S,
                                  limits=httpx.Limits(max_connections=requests + 4))
            restarts_before = gauge(client, url, "sgl_omni_stage_restarts_total")
            sampler = Sampler(url, server)
            rest_rss = dict(sampler.peak)  # the first sample: the server at rest
            answers: list[tuple[int | str, str | None, str]] = [("none", None, "")] * requests
            go = threading.Barrier(requests)

            def send(i: int) -> None:
                go.wait()
                try:
                    resp = client.post(f"{url}/v1/chat/completions",
                                       json=chat_body(host_port, i, parts))
                    message = resp.json().get("error", {}).get("message", "") \
                        if resp.status_code != 200 else ""
                    answers[i] = (resp.status_code, resp.headers.get("retry-after"), message)
                except (httpx.HTTPError, ValueError) as exc:
                    answers[i] = ("no answer", None, repr(exc))

            started = time.monotonic()
            threads = [threading.Thread(target=send, args=(i,), daemon=True)
                       for i in range(requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(ANSWER_WITHIN_S)
            took = time.monotonic() - started
            time.sleep(1.0)  # a last sample after the answers
            sampler.close()
            after = client.post(f"{url}/v1/chat/completions", json={"messages": [
                {"role": "user", "content": "<omni-script>[{\"action\": \"final\", \"text\": "
                 "\"ok\"}]</omni-script>"}]})
            restarts = gauge(client, url, "sgl_omni_stage_restarts_total") - restarts_before
            held_after = gauge(client, url, "sgl_omni_client_media_bytes")
            health_after = client.get(f"{url}/health").json().get("status")
            refused = [a for a in answers if a[0] == 503]
            fetched_requests = {p.split("/")[2].split("-")[0] for p in asked}
            summary = {
                "requests": requests, "parts_per_request": parts,
                "image_bytes": len(image), "seconds": round(took, 2),
                "statuses": dict(Counter(str(a[0]) for a in answers)),
                "refused_503": len(refused),
                "refused_with_retry_after": sum(1 for a in refused if a[1]),
                "refusal_message": refused[0][2] if refused else None,
                "other_errors": sorted({a[2] for a in answers if a[0] not in (200, 503)}),
                "requests_fetched": len(fetched_requests),
                "fetches": len(asked),
                "peak_rss_mib": {k: round(v / MiB, 1) for k, v in sorted(sampler.peak.items())},
                "rss_at_rest_mib": {k: round(v / MiB, 1) for k, v in sorted(rest_rss.items())},
                "client_media_bytes_peak": sampler.budget_peak,
                "client_media_bytes_after": held_after,
                "stage_restarts": restarts,
                "health_not_ok_samples": Counter(sampler.health_not_ok),
                "health_after": health_after,
                "plain_request_after": after.status_code,
                "stage_log": stage_lines(Path(log.name)),
                "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 1)},
                "date": time.strftime("%Y-%m-%d"),
            }
    finally:
        stop_server(proc)
        log.close()
        os.unlink(log.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=dict) + "\n")
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print(f"media burst: {summary['requests']} requests x {summary['parts_per_request']} "
          f"images of {summary['image_bytes']} bytes, answered in {summary['seconds']} s")
    print(f"  statuses {summary['statuses']}; 503 with Retry-After "
          f"{summary['refused_with_retry_after']}/{summary['refused_503']}; media fetched for "
          f"{summary['requests_fetched']} requests ({summary['fetches']} fetches)")
    print(f"  peak RSS MiB {summary['peak_rss_mib']} (at rest {summary['rss_at_rest_mib']})")
    print(f"  client media bytes peak {summary['client_media_bytes_peak']:.0f}, after "
          f"{summary['client_media_bytes_after']:.0f}; stage restarts "
          f"{summary['stage_restarts']:g}; /health not ok {summary['health_not_ok_samples']}; "
          f"after: /health {summary['health_after']}, a plain request "
          f"{summary['plain_request_after']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The burst's options on ``faults.py``'s command line."""
    parser.add_argument("--burst", type=int, default=20, help="media burst: requests at once")
    parser.add_argument("--burst-parts", type=int, default=4,
                        help="media burst: remote images per request")
    parser.add_argument("--burst-image-mib", type=float, default=63.9,
                        help="media burst: each image's size (the fetch limit is 64 MiB)")
    parser.add_argument("--burst-out", type=Path, default=DEFAULT_OUT)


def from_arguments(args: argparse.Namespace) -> int:
    """Run the burst as ``args`` ask; 0."""
    print_summary(run_burst(args.burst, args.burst_parts, args.burst_image_mib, args.burst_out))
    return 0
