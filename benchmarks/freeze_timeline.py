"""The timeline of a replica frozen for a while and resumed: when the gateway passes it over,
whether Ray replaces it, when it is healthy again and when it serves new requests.

Usage: python benchmarks/freeze_timeline.py [--freeze-s 30] [--json FILE]

Starts a local Ray instance, deploys two replicas of the interleaved pipeline with the scripted
engines (``configs/cpu-scripted.yaml``, the ``deadline`` router, Ray's default health checks:
every 2 s, 10 s timeout), keeps two clients sending streamed ``/generate`` requests back to
back and a Prometheus-like scrape of the fleet's ``/metrics`` every second, stops one replica's
server process (``SIGSTOP``) for ``--freeze-s`` seconds, resumes it (``SIGCONT``) and prints,
in seconds from the freeze, each change seen: the scrape naming it down
(``sgl_omni_gateway_replica_up`` 0) and up again, its health in its routing stats, its
generation stage's jobs growing again (new requests reaching it), and its replacement by Ray (its
replica id gone, and its replacement's health).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from sglang_omni.scale.builder import build
from sglang_omni.scale.launch import poll_replicas
from sglang_omni.scale.spec import ScaleOptions, ServerSource

CONFIG = Path(__file__).parents[1] / "configs" / "cpu-scripted.yaml"
APP = "omni"


def load(url: str, stop: threading.Event) -> None:
    async def client(n: int) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            while not stop.is_set():
                body = {"prompt": '<omni-script>[{"action": "image", "prompt": "p"}, '
                                  '{"action": "final", "text": "done"}]</omni-script> go',
                        "stream": True, "stage_params": {"generation": {
                            "width": 32, "height": 32, "seed": n}}}
                try:
                    async with http.stream("POST", f"{url}/generate", json=body) as resp:
                        await resp.aread()
                except httpx.HTTPError:
                    pass
                n += 2

    async def main() -> None:
        await asyncio.gather(client(0), client(1))

    asyncio.run(main())


def up(url: str, replica: str) -> float | None:
    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("sgl_omni_gateway_replica_up") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freeze-s", type=float, default=30.0)
    parser.add_argument("--watch-s", type=float, default=90.0,
                        help="seconds watched after the freeze began")
    parser.add_argument("--json")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=12, namespace="serve", log_to_driver=False, logging_level="error")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    events: list[tuple[float, str]] = []
    try:
        source = ServerSource.from_file(CONFIG, {"generation.factory.step_time_s": 0.05})
        serve.run(build(source, ScaleOptions(replicas=2)), name=APP, route_prefix="/")
        while True:
            stats, _ = poll_replicas(APP, 2)
            if len(stats) == 2 and all(s.get("health") == "ok" for s in stats):
                break
            time.sleep(0.2)
        stop = threading.Event()
        threading.Thread(target=load, args=(url, stop), daemon=True).start()
        time.sleep(5)
        victim = sorted(stats, key=lambda s: s["replica"])[0]
        first = {s["replica"] for s in stats}
        rid, pid = victim["replica"], victim["pid"]
        at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        thawed = False
        last: dict[str, Any] = {}

        def note(what: str) -> None:
            events.append((round(time.monotonic() - at, 1), what))
            print(f"+{events[-1][0]:5.1f} s  {what}", flush=True)

        answered = None
        while time.monotonic() - at < args.watch_s:
            if not thawed and time.monotonic() - at >= args.freeze_s:
                os.kill(pid, signal.SIGCONT)
                thawed = True
                note("SIGCONT")
            scrape = up(url, rid)
            if scrape != last.get("up"):
                note(f"scrape: replica_up {scrape}")
                last["up"] = scrape
            stats, silent = poll_replicas(APP, 1)
            for new in stats:
                if new["replica"] != rid and new["replica"] not in first:
                    key = f"new {new['replica']}"
                    if new.get("health") != last.get(key):
                        note(f"replacement {new['replica']}: {new.get('health')}")
                        last[key] = new.get("health")
            mine = {s["replica"]: s for s in stats}.get(rid)
            health = mine.get("health") if mine else ("no answer" if rid in silent else "gone")
            if health != last.get("health"):
                note(f"its stats: {health}")
                last["health"] = health
            if mine is not None:
                count = mine["stages"]["generation"]["jobs"]["submitted"]
                if answered is not None and count > answered and not last.get("serving"):
                    note("it answers new requests")
                    last["serving"] = True
                answered = count
            time.sleep(1.0)
        stop.set()
        if not thawed:
            os.kill(pid, signal.SIGCONT)
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({"freeze_s": args.freeze_s, "events": events},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
