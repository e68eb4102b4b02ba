"""The ``freeze-retry`` fault of ``fleet_faults.py``: a replica frozen with calls on it,
thawed after the gateway asked another replica; counts what ran twice and how long fleet reads
took meanwhile.

Each trial (direct generation with the scripted generator, ``configs/cpu-direct-scripted.yaml``,
the ``deadline`` router, two replicas): ``--burst`` clients each ``POST /v1/videos`` at once,
then, after a random 0-300 ms, the trial's replica (each in turn) is stopped (``SIGSTOP``), so
calls are caught on it at every stage: sent but not received, received but not admitted,
admitted. While it is frozen the fleet's reads are timed back to back (``GET /metrics``,
``GET /v1/videos``, ``GET /v1/queue``); once every client has its answer and a second more has
passed, or after :data:`FREEZE_MAX_S` (a client whose call's answer had left the replica just as
it froze waits for it: ``waited_for_thaw``), it is resumed (``SIGCONT``), and the trial waits
until every client has its answer and the replica holds no call. Then:

* ``phantom_jobs``: video jobs ``GET /v1/videos`` lists that no client was given the id of
  (a call the frozen replica had taken, ``taken``, is answered at once with a 500 saying it is
  dropped there; when the replica resumes it deletes the job it made for it);
* ``ran_twice``: generations the replicas ran beyond one per ``POST`` (their generation stages'
  ``submitted`` counters, before and after): a call that ran on both replicas;
* ``reads_max_s``: the slowest fleet read during the freeze;
* ``retried`` (the gateway's ``sgl_omni_gateway_replica_silences_total`` growth: calls silent on
  the frozen replica) and ``failed`` (clients answered with an error: calls the frozen replica
  had taken, which are not asked elsewhere).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from ray import serve

from sglang_omni.scale.builder import build
from sglang_omni.scale.launch import replica_stats
from sglang_omni.scale.silent_replicas import TAKEN
from sglang_omni.scale.spec import ScaleOptions, ServerSource

CONFIG = Path(__file__).parents[1] / "configs" / "cpu-direct-scripted.yaml"
APP = "omni"
VIDEO = {"prompt": "a wave", "size": "32x32", "num_frames": 5, "fps": 5}
READS = ("/metrics", "/v1/videos", "/v1/queue")
#: The freeze comes up to this many seconds after the calls were sent.
JITTER_S = 0.3
#: Seconds a freeze lasts at most (less when every client has its answer before): past the
#: silence limit (6 s), short of Ray's health checks replacing the replica (10 s and more).
FREEZE_MAX_S = 8.0


def deploy(replicas: int) -> None:
    """The direct fleet, its stages kept through a freeze (their stall timeout 60 s)."""
    source = ServerSource.from_file(CONFIG, {"generation.factory.stall_timeout_s": 60})
    if APP in serve.status().applications:
        serve.delete(APP)
    serve.run(build(source, ScaleOptions(replicas=replicas)), name=APP, route_prefix="/")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        stats = replica_stats(APP, timeout_s=2)
        if len(stats) == replicas and all(s.get("health") == "ok" for s in stats):
            return
        time.sleep(0.2)
    raise RuntimeError("the fleet did not become healthy")


def jobs_run() -> int:
    return sum(s["stages"]["generation"]["jobs"]["submitted"] for s in replica_stats(APP))


def silences(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sgl_omni_gateway_replica_silences_total"))


def trial(url: str, victim: dict[str, Any], burst: int) -> dict[str, Any]:
    before_jobs, before_silences = jobs_run(), silences(url)
    answers: list[tuple[int, dict[str, Any]]] = []

    def post() -> None:
        try:
            resp = httpx.post(f"{url}/v1/videos", json=VIDEO, timeout=120)
            answers.append((resp.status_code, resp.json()))
        except httpx.HTTPError as exc:
            answers.append((0, {"error": str(exc)}))

    posts = [threading.Thread(target=post, daemon=True) for _ in range(burst)]
    for thread in posts:
        thread.start()
    time.sleep(random.uniform(0, JITTER_S))  # the benchmark's own jitter: calls at every stage
    os.kill(victim["pid"], signal.SIGSTOP)
    frozen = time.monotonic()
    reads: list[float] = []
    by_path: dict[str, float] = {}
    try:
        while (any(t.is_alive() for t in posts)
               and time.monotonic() - frozen < FREEZE_MAX_S):
            for path in READS:
                began = time.monotonic()
                httpx.get(f"{url}{path}", timeout=120)
                reads.append(time.monotonic() - began)
                by_path[path] = max(by_path.get(path, 0.0), reads[-1])
        waiting = sum(t.is_alive() for t in posts)
        if not waiting:
            time.sleep(1.0)
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    thawed = time.time()
    for thread in posts:
        thread.join(120)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # it has taken up and ended what reached it
        stats = {s["replica"]: s for s in replica_stats(APP)}
        mine = stats.get(victim["replica"])
        if mine and mine["at"] > thawed + 1 and all(s["in_flight"] == 0
                                                    for s in stats.values()):
            break
        time.sleep(0.2)
    known = {body["id"] for status, body in answers if status == 200}
    taken = sum(TAKEN in body.get("error", {}).get("message", "")
                for status, body in answers if status != 200)
    listed = httpx.get(f"{url}/v1/videos", timeout=120).json()
    ids = {job["id"] for job in listed["data"]}
    return {"victim": victim["replica"], "posts": burst, "ok": len(known),
            "failed": burst - len(known),
            "retried": silences(url) - before_silences,
            "ran_twice": max(0, jobs_run() - before_jobs - burst),
            "taken": taken, "waited_for_thaw": waiting,
            "unknown_jobs": len(ids - known_all(known)),
            "reads": len(reads), "reads_max_s": max(reads, default=0.0),
            "reads_max_s_by_path": by_path,
            "unanswered_after": listed.get("unanswered_replicas"),
            "said": sorted({body.get("error", {}).get("message", "")[:90]
                            for status, body in answers if status != 200})}


_known: set[str] = set()


def known_all(new: set[str]) -> set[str]:
    """Every id a client of this run was given (jobs of earlier trials stay listed)."""
    _known.update(new)
    return _known


def summarize(rows: list[dict[str, Any]], replicas: int, burst: int) -> dict[str, Any]:
    """The JSON of a run: its totals, then its rows (``unknown_jobs`` is cumulative: the list
    holds every trial's jobs)."""
    unknown = rows[-1]["unknown_jobs"] if rows else 0
    taken = sum(r["taken"] for r in rows)
    return {"fault": "freeze-retry", "trials": len(rows), "replicas": replicas, "burst": burst,
            "posts": sum(r["posts"] for r in rows),
            "retried": sum(r["retried"] for r in rows),
            "failed": sum(r["failed"] for r in rows), "taken": taken,
            "ran_twice": sum(r["ran_twice"] for r in rows),
            "waited_for_thaw": sum(r["waited_for_thaw"] for r in rows),
            "phantom_jobs": unknown,
            "reads_max_s": max((r["reads_max_s"] for r in rows), default=0.0),
            "rows": rows}


def run(url: str, replicas: int, trials: int, burst: int, out: str | None) -> dict[str, Any]:
    deploy(replicas)
    rows = []
    for n in range(trials):
        victims = sorted(replica_stats(APP), key=lambda s: s["replica"])
        row = trial(url, victims[n % len(victims)], burst)
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = summarize(rows, replicas, burst)
    if out:
        Path(out).write_text(json.dumps(summary, indent=1))
    return summary
