"""Issue 33's attacker requests, run again as written: does every stage survive and /health stay ok?

Usage: python benchmarks/attacks.py [--placebo-rounds 10] [--sessions 150] [--actions 3]
                                    [--out benchmarks/results/attacks.json]

Starts ``sgl-omni serve`` with the scripted engines twice (the direct pipeline,
``configs/cpu-direct-scripted.yaml``, and the interleaved one, ``configs/cpu-scripted.yaml``),
each with its default settings, and sends:

* ``placebo``: ``--placebo-rounds`` times in a row, ``POST /v1/videos`` with a 1280x720 video of
  121 frames at 24 fps, one step, ``x264_preset: placebo``; and the same preset through
  ``/generate``'s ``stage_params.generation.x264_preset``. After each request ``/health`` is read;
* ``realtime``: ``--sessions`` ``WS /v1/actions/realtime`` sessions at once, each sending
  ``--actions`` actions one after another; it counts answered and refused actions and the most
  action jobs the stage held at once (``/metrics``, read while the flood runs).

For each it prints what the requests got, whether ``/health`` was ok after every one, and whether
the stage processes are the ones it started with (no restart). The media burst and the memory
attack are ``benchmarks/faults.py --faults "media burst"`` and ``benchmarks/memory_creep.py
--connections new``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_kit import REPO, Server  # noqa: E402

PLACEBO_VIDEO = {"prompt": "a slow encode", "size": "1280x720", "num_frames": 121, "fps": 24,
                 "num_inference_steps": 1, "x264_preset": "placebo"}


def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def stage_pids(server: Server) -> list[int]:
    return sorted(c.pid for c in psutil.Process(server.proc.pid).children())


def health(url: str) -> str:
    try:
        resp = httpx.get(f"{url}/health", timeout=10)
    except httpx.HTTPError as exc:
        return f"unreachable ({exc.__class__.__name__})"
    return "ok" if resp.status_code == 200 else f"{resp.status_code} {resp.text[:120]}"


def video_job(url: str) -> str:
    """The placebo video job's outcome: its HTTP refusal, or the job's final status."""
    resp = httpx.post(f"{url}/v1/videos", json=PLACEBO_VIDEO, timeout=60)
    if resp.status_code != 200:
        return f"{resp.status_code}: {resp.json().get('error', {}).get('message', '')[:100]}"
    job = resp.json()["id"]
    deadline = time.time() + 900
    while time.time() < deadline:
        status = httpx.get(f"{url}/v1/videos/{job}", timeout=30).json()
        if status.get("status") in ("completed", "failed"):
            return f"job {status['status']}"
        time.sleep(0.5)
    return "job unfinished after 900 s"


def generate(url: str) -> str:
    script = json.dumps([{"action": "video", "prompt": "slow"}, {"action": "final", "text": "x"}])
    body = {"prompt": f"<omni-script>{script}</omni-script>",
            "stage_params": {"generation": {"width": 1280, "height": 720, "num_frames": 121,
                                            "num_inference_steps": 1,
                                            "x264_preset": "placebo"}}}
    resp = httpx.post(f"{url}/generate", json=body, timeout=900)
    if resp.status_code == 200:
        return "200"
    return f"{resp.status_code}: {resp.json().get('error', {}).get('message', '')[:100]}"


def placebo(server: Server, rounds: int, send: Any) -> dict[str, Any]:
    pids = stage_pids(server)
    answers: list[str] = []
    healths: list[str] = []
    for _ in range(rounds):
        answers.append(send(server.url))
        healths.append(health(server.url))
        print(f"  {answers[-1]} -> /health {healths[-1]}", flush=True)
    return {"answers": dict(Counter(answers)), "health_ok_after_each": all(
        h == "ok" for h in healths), "stages_restarted": stage_pids(server) != pids}


def action_jobs_running(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "sgl_omni_stage_jobs_total"
              and s.labels.get("stage") == "generation"}
    return counts.get("submitted", 0) - sum(counts.get(k, 0) for k in
                                            ("completed", "failed", "aborted"))


def realtime(server: Server, sessions: int, actions: int) -> dict[str, Any]:
    from sglang_omni.client import Client
    from sglang_omni.client.types import OmniClientError

    request = {"input": {"task": "pick", "image": {"b64_json": base64.b64encode(png()).decode()}},
               "parameters": {"domain_name": "droid_lerobot", "raw_action_dim": 8}}
    pids = stage_pids(server)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    most = 0.0
    done = threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, action_jobs_running(server.url))
            time.sleep(0.05)

    def session(_: int) -> None:
        try:
            with Client(server.url, timeout=300) as client, client.realtime_actions() as robot:
                for _ in range(actions):
                    robot.generate(request)
                    with lock:
                        outcomes["answered"] += 1
        except OmniClientError as exc:
            with lock:
                outcomes[f"refused {exc.status}"] += 1
        except Exception as exc:  # noqa: BLE001 - a benchmark counts every kind of end
            with lock:
                outcomes[f"failed {exc.__class__.__name__}"] += 1

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.time()
    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(session, range(sessions)))
    done.set()
    watcher.join()
    return {"sessions": sessions, "actions_each": actions, "outcomes": dict(outcomes),
            "most_jobs_at_once": most, "took_s": round(time.time() - started, 1),
            "health": health(server.url), "stages_restarted": stage_pids(server) != pids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placebo-rounds", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=150)
    parser.add_argument("--actions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/attacks.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in (("direct", "cpu-direct-scripted.yaml"), ("umm", "cpu-scripted.yaml")):
            server = Server(REPO / "configs" / config, Path(tmp) / f"{name}.log", dict(os.environ))
            try:
                server.wait_ready(180)
                if name == "direct":
                    print("placebo video jobs (POST /v1/videos):", flush=True)
                    results["placebo_videos"] = placebo(server, args.placebo_rounds, video_job)
                    print(f"realtime: {args.sessions} x {args.actions} actions", flush=True)
                    results["realtime"] = realtime(server, args.sessions, args.actions)
                    print(f"  {results['realtime']}", flush=True)
                else:
                    print("placebo through /generate:", flush=True)
                    results["placebo_generate"] = placebo(server, args.placebo_rounds, generate)
            finally:
                server.stop()
    results["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
