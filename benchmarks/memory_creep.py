"""Does the server's memory creep across worst-case requests, on one connection or new ones?

Usage: python benchmarks/memory_creep.py [--requests 100] [--videos 8] [--video-mb 8]
                                         [--stream] [--connections keep-alive|new|both]
                                         [--idle-s 60] [--env NAME=VALUE ...] [--json PATH]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``) and sends
``--requests`` of the spec's worst-case requests one at a time: an interleaved ``/generate``
request whose Reasoner (scripted) asks for ``--videos`` videos padded to ``--video-mb`` MiB (the
8 MiB inline limit by default), so each turn carries every video made so far, ending with a
final answer (``--stream``: streamed, read to its ``[DONE]``). ``--connections``: every request
on one keep-alive connection, each on a new connection (closed after its answer, as a client
without a connection pool does), or both, each on a server of its own (default). For each mode
it prints the RSS of the server process and of its stage processes when ready, after the first
request, at checkpoints, its peak (``VmHWM``) and after ``--idle-s`` seconds idle at the end,
and the growth from ready to after idle (target: within 300 MiB). ``--env`` sets allocator
variables for the server (``MALLOC_ARENA_MAX=2``, ``MALLOC_MMAP_THRESHOLD_=1048576``) to tell a
leak (something kept per request: the growth stays) from the allocator (the growth goes with
its settings). ``--json`` also writes the rows there.
"""

from __future__ import annotations

import argparse
import json
import os
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
MODES = {"keep-alive": ("keep-alive",), "new": ("new",), "both": ("keep-alive", "new")}


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


def peak_mib(pid: int) -> float:
    """The server process's peak RSS so far (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def send(client: httpx.Client, url: str, body: bytes, stream: bool, n: int) -> None:
    with client.stream("POST", f"{url}/generate", content=body,
                       headers={"content-type": "application/json"}) as resp:
        text = resp.read().decode(errors="replace")
    if resp.status_code != 200 or (stream and '"error"' in text[-2000:]):
        raise SystemExit(f"request {n}: {resp.status_code} {text[-300:]}")


def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str],
             body: bytes) -> list[tuple[str, float, float]]:
    """One server, ``args.requests`` requests on ``mode``'s connections: the RSS rows."""
    checkpoints = {1, 10, 25, 50, 75, args.requests}
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(REPO / "configs" / "cpu-scripted.yaml", Path(tmp) / "server.log", env)
        try:
            server.wait_ready(120)
            proc = psutil.Process(server.proc.pid)
            rows.append(("ready", *rss_mib(proc)))
            client = httpx.Client(timeout=600)
            try:
                for n in range(1, args.requests + 1):
                    if mode == "new" and n > 1:
                        client.close()  # the server sees the connection end
                        client = httpx.Client(timeout=600)
                    send(client, server.url, body, args.stream, n)
                    if n in checkpoints:
                        rows.append((f"after {n}", *rss_mib(proc)))
                        print(f"{mode}: after {n}: server {rows[-1][1]:.0f} MiB", flush=True)
            finally:
                client.close()
            time.sleep(args.idle_s)
            rows.append((f"after {args.idle_s:g} s idle", *rss_mib(proc)))
            rows.append(("peak", peak_mib(proc.pid), float("nan")))
        finally:
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--video-mb", type=int, default=8)
    parser.add_argument("--stream", action="store_true", help="stream each answer (SSE)")
    parser.add_argument("--connections", choices=sorted(MODES), default="both",
                        help="one keep-alive connection, a new one per request, or both")
    parser.add_argument("--idle-s", type=float, default=60.0,
                        help="seconds idle after the last request before the last reading")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--json", type=Path, help="also write the figures there")
    args = parser.parse_args()
    env = dict(os.environ)
    env.update(dict(item.split("=", 1) for item in args.env))
    body = worst_case_body(args.videos, args.video_mb, args.stream)
    results: dict[str, Any] = {}
    for mode in MODES[args.connections]:
        rows = run_mode(mode, args, env, body)
        results[mode] = rows
        print(f"\n{mode} connection{'s' if mode == 'new' else ''}: {args.videos} videos of "
              f"{args.video_mb} MiB per request{', streamed' if args.stream else ''}; "
              f"env: {' '.join(args.env) or '(default)'}\n")
        print("| when | server RSS MiB | stages RSS MiB |")
        print("|---|---|---|")
        for name, server_mib, stages_mib in rows:
            print(f"| {name} | {server_mib:.0f} | "
                  f"{'-' if stages_mib != stages_mib else f'{stages_mib:.0f}'} |")
        ready, idle = rows[0][1], rows[-2][1]
        print(f"\n{mode}: server from ready to after idle: {idle - ready:+.0f} MiB, peak "
              f"{rows[-1][1] - ready:+.0f} MiB (target: within 300 MiB after idle)", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "load": os.getloadavg(),
             "modes": {mode: [{"when": name, "server_mib": round(s, 1),
                               "stages_mib": None if t != t else round(t, 1)}
                              for name, s, t in rows] for mode, rows in results.items()}},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
