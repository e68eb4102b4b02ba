"""Does the server's memory creep across worst-case requests?

Usage: python benchmarks/memory_creep.py [--requests 100] [--videos 8] [--video-mb 8]
                                         [--stream] [--env NAME=VALUE ...]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``) and sends
``--requests`` of the spec's worst-case requests one at a time: an interleaved ``/generate``
request whose Reasoner (scripted) asks for ``--videos`` videos padded to ``--video-mb`` MiB (the
8 MiB inline limit by default), so each turn carries every video made so far, ending with a
final answer (``--stream``: streamed, read to its ``[DONE]``). It prints the RSS of the server
process and of its stage processes after the first request, at checkpoints, and after 20 s idle
at the end, and the growth from the first request to the last. ``--env`` sets allocator
variables for the server (``MALLOC_ARENA_MAX=2``, ``MALLOC_MMAP_THRESHOLD_=1048576``) to tell a
leak (something kept per request: the growth stays) from the allocator (the growth goes with
its settings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_kit import REPO, Server  # noqa: E402

MiB = 2**20


def worst_case_body(videos: int, video_mb: int, stream: bool) -> bytes:
    size = video_mb * MiB - 4096  # under the inline limit with the container's own bytes
    actions = [{"action": "video", "prompt": f"!size={size} clip {i}"} for i in range(videos)]
    script = json.dumps([*actions, {"action": "final", "text": "done"}])
    return json.dumps({"prompt": f"<omni-script>{script}</omni-script>", "stream": stream,
                       "stage_params": {"generation": {"width": 32, "height": 32,
                                                       "num_frames": 2}}}).encode()


def rss_mib(server: psutil.Process) -> tuple[float, float]:
    """(the server process's RSS, its stage processes' RSS together) in MiB."""
    children = sum(c.memory_info().rss for c in server.children(recursive=True))
    return server.memory_info().rss / MiB, children / MiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--video-mb", type=int, default=8)
    parser.add_argument("--stream", action="store_true", help="stream each answer (SSE)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    env = dict(os.environ)
    env.update(dict(item.split("=", 1) for item in args.env))
    checkpoints = {1, 10, 25, 50, 75, args.requests}
    body = worst_case_body(args.videos, args.video_mb, args.stream)
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log", env)
        try:
            server.wait_ready(120)
            proc = psutil.Process(server.proc.pid)
            rows.append(("ready", *rss_mib(proc)))
            with httpx.Client(timeout=600) as client:
                for n in range(1, args.requests + 1):
                    with client.stream("POST", f"{server.url}/generate", content=body,
                                       headers={"content-type": "application/json"}) as resp:
                        text = resp.read().decode(errors="replace")
                    if resp.status_code != 200 or (args.stream and '"error"' in text[-2000:]):
                        raise SystemExit(f"request {n}: {resp.status_code} {text[-300:]}")
                    if n in checkpoints:
                        rows.append((f"after {n}", *rss_mib(proc)))
                        print(f"after {n}: server {rows[-1][1]:.0f} MiB", flush=True)
            time.sleep(20)
            rows.append(("after 20 s idle", *rss_mib(proc)))
        finally:
            server.stop()
    print(f"\n{args.videos} videos of {args.video_mb} MiB per request"
          f"{', streamed' if args.stream else ''}; env: {' '.join(args.env) or '(default)'}\n")
    print("| when | server RSS MiB | stages RSS MiB |")
    print("|---|---|---|")
    for name, server_mib, stages_mib in rows:
        print(f"| {name} | {server_mib:.0f} | {stages_mib:.0f} |")
    first = next(r for r in rows if r[0] == "after 1")
    last = next(r for r in rows if r[0] == f"after {args.requests}")
    print(f"\nserver growth from request 1 to {args.requests}: {last[1] - first[1]:+.0f} MiB "
          "(target: within 300 MiB)")


if __name__ == "__main__":
    main()
