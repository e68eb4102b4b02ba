"""How much memory the server takes to handle one large accepted body, as a multiple of its size.

Usage: python benchmarks/body_memory.py [--body-mb 150] [--parts 3] [--repeat 3] [--routes NAMES]
       python benchmarks/body_memory.py --parse [--body-mb 150] [--parts 3]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``) and sends,
one at a time, bodies of about ``--body-mb`` MB whose bulk is inline media split into
``--parts`` base64 items (each under the 64 MiB one-file limit): ``/generate`` with ``images``
and with ``videos``, and ``/v1/chat/completions`` with ``image_url`` and ``video_url`` data URLs.
Before each request, once the server's RSS has settled, its peak RSS is reset
(``/proc/PID/clear_refs``, 5); after its answer the peak (``VmHWM``) less the RSS before it is
the memory the request took. Each route is first sent once with a small body of the same shape
(about 1/50 of ``--body-mb``), so what the process loads for its first medium (PyAV, PIL) is
not counted as a request's. Prints that growth divided by the body's size, median and range of
``--repeat`` runs per route (target: under 1.5).

``--parse`` measures the body readers alone, in this process, with tracemalloc (exact and
deterministic, no server): the peak of Python allocations while a body of about ``--body-mb``
MB arrives in 64 KiB chunks and is parsed into the value a route validates, as a multiple of the
body's size (the body's chunks count as they arrive), for JSON (``--parts`` base64 data URLs,
and one), a multipart form (``--parts`` uploads, and one) and msgpack (``--parts`` data URLs,
and one).
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
from typing import Any

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


def request_of(body: bytes, content_type: str) -> Any:
    """A Starlette request whose ``body`` arrives in 64 KiB messages, each dropped once read."""
    from starlette.applications import Starlette
    from starlette.requests import Request

    pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    pieces.reverse()

    async def receive() -> dict[str, Any]:
        if pieces:
            return {"type": "http.request", "body": pieces.pop(), "more_body": bool(pieces)}
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(b"content-type", content_type.encode())], "app": Starlette()}
    return Request(scope, receive)


def parse_cases(body_mb: int, parts: int) -> dict[str, tuple[str, bytes]]:
    """Case name -> (Content-Type, body) for ``--parse``."""
    import msgpack

    cases: dict[str, tuple[str, bytes]] = {}
    for n in sorted({parts, 1}, reverse=True):
        urls = [f"data:image/png;base64,{p}" for p in payloads(body_mb, n, padded_png)]
        cases[f"JSON, {n} data URL(s)"] = ("application/json", json.dumps(
            {"prompt": "describe", "images": urls}).encode())
        files = [padded_png(body_mb * MB // n) for _ in range(n)]
        form = b"".join(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"image[]\"; filename=\"a.png\"\r\n"
            b"Content-Type: image/png\r\n\r\n" + f + b"\r\n" for f in files)
        cases[f"multipart, {n} upload(s)"] = (
            "multipart/form-data; boundary=XyZ",
            b"--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\ndescribe\r\n"
            + form + b"--XyZ--\r\n")
        cases[f"msgpack, {n} data URL(s)"] = ("application/msgpack", msgpack.packb(
            {"prompt": "describe", "images": urls}))
    return cases


def parse_peak(content_type: str, body: bytes) -> float:
    """Peak traced allocations while ``body`` is read and parsed, as a multiple of its size."""
    import asyncio
    import tracemalloc

    from sglang_omni.serve.bodies.body_formats import form_value
    from sglang_omni.serve.bodies.msgpack_body import read_msgpack_body
    from sglang_omni.serve.bodies.multipart_body import read_form
    from sglang_omni.serve.bodies.request_body import read_json_body

    size = len(body)
    request = request_of(body, content_type)
    del body  # the request's chunks are all that is left of it

    async def parse() -> Any:
        if content_type.startswith("multipart/"):
            return form_value(await read_form(request), {})
        if content_type == "application/msgpack":
            return await read_msgpack_body(request)
        return await read_json_body(request)

    tracemalloc.start()
    try:
        value = asyncio.run(parse())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del value
    return peak / size


def main_parse(body_mb: int, parts: int) -> None:
    print("| body | MB | peak / body size (tracemalloc) |")
    print("|---|---|---|")
    for name, (content_type, body) in parse_cases(body_mb, parts).items():
        size = len(body) / MB
        print(f"| {name} | {size:.0f} | {parse_peak(content_type, body):.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parse", action="store_true",
                        help="measure the body readers alone, in process (tracemalloc)")
    parser.add_argument("--body-mb", type=int, default=150)
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--routes", default="",
                        help="comma-separated route names to run (default: all)")
    args = parser.parse_args()
    if args.parse:
        main_parse(args.body_mb, args.parts)
        return
    cases = bodies(args.body_mb, args.parts)
    if args.routes:
        cases = {k: v for k, v in cases.items() if k in args.routes.split(",")}
    results: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log",
                        dict(os.environ), args=RETAIN_ALL)
        try:
            server.wait_ready(120)
            # what a process loads on its first large medium (PyAV and PIL, their codecs)
            # is not a request's: each route is sent a small body of the same shape first
            for path, body in bodies(max(3, args.body_mb // 50), args.parts).values():
                measure(server, path, body)
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
