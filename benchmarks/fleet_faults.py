"""Fleet chaos: faults in a fleet of replicas under steady streaming load, and what clients saw.

Usage: python benchmarks/fleet_faults.py [--runs 3] [--replicas 2] [--clients 8]
       [--step-time 0.05] [--faults replica-kill,stage-kill,replica-stop,node-kill]
       [--stop-s 45] [--json FILE]
       python benchmarks/fleet_faults.py --faults freeze-retry [--trials 20] [--burst 4]
       [--json FILE]

Starts a local Ray instance, deploys the interleaved pipeline with the scripted engines
(``configs/cpu-scripted.yaml``, the ``deadline`` router, Ray's default health checks) on
``--replicas`` replicas, and keeps ``--clients`` clients sending streamed ``/generate`` requests
back to back (each: two image generations of 4 steps of ``--step-time`` s, then a final text).
Once the fleet has served a steady while, each fault in turn hits one replica:

* ``replica-kill``: ``kill -9`` of the replica's server process;
* ``stage-kill``: ``kill -9`` of the generation stage process inside one replica;
* ``replica-stop``: ``SIGSTOP`` of the replica's server process, ``SIGCONT`` once Ray has
  replaced it and ``--stop-s`` seconds have passed (the process then sees its stages gone while
  Ray stops it: no client may hear of that);
* ``node-kill``: the death of a whole node of a multi-node Ray cluster. With this fault the
  benchmark runs a local cluster of two nodes on this machine instead of one Ray instance
  (:mod:`ray_nodes`: a head node, which runs Serve's controller, its HTTP proxy and the gateway,
  and a worker node; Serve spreads the replicas over both, and the benchmark redeploys until one
  runs on the worker node), then kills every process of the worker node at once (its raylet,
  its agents, its Ray workers with the replicas on it, their stage processes: ``SIGSTOP`` of
  all, then ``SIGKILL`` of all, as a power cut). Ray replaces the node's replicas on the head;
* ``node-stop``: the same node's processes all stopped (``SIGSTOP``) and left so, as a host gone
  from the network (nothing answers, no connection closes), then killed once Ray has replaced
  its replicas.

* ``freeze-retry`` (run alone: its own deployment, direct generation, ``--trials`` trials of
  ``--burst`` calls): a replica frozen with calls on it and resumed once the gateway asked the
  other replica; the JSON reports ``ran_twice``, ``phantom_jobs`` and ``reads_max_s``
  (:mod:`freeze_retry`).

``node-kill`` and ``node-stop`` each need a replica on the worker node: ask for one of them a
run (after it, Serve's replacement runs on the head).

For each fault the table shows: ``in flight``, the faulted replica's requests in flight just
before (its routing stats); ``failed``, requests that ended without a complete answer from the
fault until the fleet recovered (target: only those of the faulted replica, so ``failed`` <=
``in flight`` plus what reached it before it was passed over); ``framed``, of those, the ones
that ended as the route frames an error (``event: error`` then ``[DONE]``; target: all);
``cause named``, of those, the ones whose error names the fault (:data:`CAUSES`: the replica
exited, the generation stage, the replica stopped answering; target: all);
``answered s``, from the fault until the last of them ended (target for a frozen replica: 10);
``around s``, from the fault until the last request sent that failed (0: no request sent after
the fault failed; new requests went around it); ``replaced s``, from the fault until every
replica was healthy again with the faulted one replaced (a stage: restarted, the replica
healthy); ``after``, requests that failed after that (target 0). Each run deploys afresh;
with ``--runs`` over 1, each cell is the median and the range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ray
from freeze_retry import run as freeze_retry
from ray import serve
from ray_nodes import LocalNodes, on_head

from sglang_omni.scale.builder import build
from sglang_omni.scale.launch import replica_stats
from sglang_omni.scale.spec import ScaleOptions, ServerSource

ROOT = Path(__file__).parents[1]
CONFIG = ROOT / "configs" / "cpu-scripted.yaml"
APP = "omni"
FAULTS = ("replica-kill", "stage-kill", "replica-stop", "node-kill", "node-stop",
          "freeze-retry")
REPLICA_EXITED = "the replica serving this request exited"
#: What a failed request's error must say for each fault (its true cause), one of these.
CAUSES = {"replica-kill": (REPLICA_EXITED,), "stage-kill": ("the generation stage",),
          "replica-stop": ("stopped answering",),
          # the replica's process is gone, or (a host gone without a word) silent
          "node-kill": (REPLICA_EXITED, "stopped answering"),
          "node-stop": (REPLICA_EXITED, "stopped answering")}
#: Deployments tried before giving up on Serve placing a replica on the worker node.
PLACEMENT_ATTEMPTS = 4
#: Seconds of load before the first fault and between recovery and the next fault.
STEADY_S = 5.0
#: Seconds a fault may take to recover before the run gives up on it.
RECOVER_WITHIN_S = 180.0


@dataclass
class Outcome:
    sent: float
    ended: float = 0.0
    end: str = ""  # complete, refused, framed (an error framed as the route frames it), cut
    message: str = ""  # a framed error's message


@dataclass
class Load:
    """Closed-loop clients: each sends its next request when the last ended."""

    url: str
    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def body(self, n: int) -> dict[str, Any]:
        entries = [{"action": "image", "prompt": f"p{n}-{i}"} for i in range(2)]
        entries.append({"action": "final", "text": "done"})
        return {"prompt": f"<omni-script>{json.dumps(entries)}</omni-script> go",
                "stream": True, "stage_params": {"generation": {
                    "width": 32, "height": 32, "seed": n, "num_inference_steps": 4}}}

    async def client(self, index: int) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            n = index
            while not self.stop.is_set():
                out = Outcome(time.monotonic())
                self.outcomes.append(out)
                try:
                    async with http.stream("POST", f"{self.url}/generate",
                                           json=self.body(n)) as resp:
                        text = (await resp.aread()).decode()
                        status = resp.status_code
                except httpx.HTTPError:
                    out.end, out.ended = "cut", time.monotonic()
                    continue
                out.ended = time.monotonic()
                if status == 503:
                    out.end = "refused"
                elif status == 200 and "event: complete" in text:
                    out.end = "complete"
                elif status == 200 and "event: error" in text and \
                        text.rstrip().endswith("data: [DONE]"):
                    out.end = "framed"
                    error = text.rsplit("event: error\ndata: ", 1)[1].split("\n", 1)[0]
                    out.message = str(json.loads(error).get("message", ""))
                elif status != 200 and text.startswith("{") and '"error"' in text:
                    out.end = "framed"
                    out.message = str(json.loads(text)["error"].get("message", ""))
                else:
                    out.end = "cut"
                n += self.clients

    def run(self) -> threading.Thread:
        async def main() -> None:
            await asyncio.gather(*(self.client(i) for i in range(self.clients)))

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        return thread


def deploy(args: argparse.Namespace, nodes: LocalNodes | None) -> None:
    """Deploy afresh and wait until every replica is healthy; on a cluster of ``nodes``, with
    the gateway on the head and at least one replica on the worker node."""
    overrides = {"generation.factory.step_time_s": args.step_time,
                 "orchestrator.factory.timeout_s": 120, "orchestrator.factory.max_active": 64}
    source = ServerSource.from_file(CONFIG, overrides)
    for _ in range(PLACEMENT_ATTEMPTS):
        if APP in serve.status().applications:
            serve.delete(APP)
        app = build(source, ScaleOptions(replicas=args.replicas))
        serve.run(app if nodes is None else on_head(app), name=APP, route_prefix="/")
        healthy(args.replicas, set(), RECOVER_WITHIN_S)
        if nodes is None or on_node(nodes.worker().node_id):
            return
        print("note: no replica on the worker node; deploying again", file=sys.stderr)
    raise RuntimeError(f"Serve placed no replica on the worker node in {PLACEMENT_ATTEMPTS} "
                       "deployments")


def on_node(node_id: str) -> list[dict[str, Any]]:
    """The routing stats of the replicas on node ``node_id``."""
    return [s for s in replica_stats(APP) if s.get("node") == node_id]


def healthy(replicas: int, gone: set[str], within_s: float,
            stage_pid: tuple[str, int] | None = None) -> float:
    """Wait until ``replicas`` replicas are ok, none of them in ``gone``, and (``stage_pid``:
    replica, old pid) that replica's generation stage has a new pid; when it happened."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stats = replica_stats(APP, timeout_s=2)
        ok = [s for s in stats if s.get("health") == "ok" and s["replica"] not in gone]
        restarted = stage_pid is None or any(
            s["replica"] == stage_pid[0] and s["stages"]["generation"]["pid"] != stage_pid[1]
            for s in ok)
        if len(ok) >= replicas and restarted:
            return time.monotonic()
        time.sleep(0.1)
    raise RuntimeError(f"the fleet did not recover within {within_s:g} s")


def fault(kind: str, load: Load, args: argparse.Namespace, nodes: LocalNodes | None
          ) -> dict[str, Any]:
    """Hit one replica (``node-kill``: a node, with its replicas) with ``kind`` and measure
    what the clients saw."""
    time.sleep(STEADY_S)  # steady load (the benchmark paces itself; nothing to sync on)
    extra: dict[str, Any] = {}
    if kind in ("node-kill", "node-stop"):
        assert nodes is not None
        node = nodes.worker()
        victims = on_node(node.node_id)
        if not victims:
            raise RuntimeError("node-kill: no replica runs on the worker node now")
        in_flight = sum(s["in_flight"] for s in victims)
        counted = gateway_failures(load.url)
        at = time.monotonic()
        extra["processes"] = nodes.kill(node, stop_only=kind == "node-stop")
        back = healthy(args.replicas, {s["replica"] for s in victims}, RECOVER_WITHIN_S)
        extra["replicas_on_node"] = len(victims)
        time.sleep(STEADY_S)  # requests after the recovery
        nodes.forget(node)
        extra["counted"] = gateway_failures(load.url) - counted
        return measure(kind, load, at, back, in_flight) | extra
    stats = sorted(replica_stats(APP), key=lambda s: -s["in_flight"])
    victim = stats[0]
    in_flight = victim["in_flight"]
    at = time.monotonic()
    if kind == "replica-kill":
        os.kill(victim["pid"], signal.SIGKILL)
        back = healthy(args.replicas, {victim["replica"]}, RECOVER_WITHIN_S)
    elif kind == "stage-kill":
        pid = victim["stages"]["generation"]["pid"]
        os.kill(pid, signal.SIGKILL)
        back = healthy(args.replicas, set(), RECOVER_WITHIN_S, (victim["replica"], pid))
    else:
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            back = healthy(args.replicas, {victim["replica"]}, RECOVER_WITHIN_S)
            time.sleep(max(0.0, at + args.stop_s - time.monotonic()))
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
    time.sleep(STEADY_S)  # requests after the recovery
    return measure(kind, load, at, back, in_flight)


def gateway_failures(url: str) -> float:
    """The gateway's count of requests a replica's death or silence failed (its metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("sgl_omni_gateway_replica_exits_total",
                                   "sgl_omni_gateway_replica_silences_total")))


def measure(kind: str, load: Load, at: float, back: float, in_flight: int) -> dict[str, Any]:
    """The row of a fault at ``at``, recovered at ``back``, with ``in_flight`` requests on what
    it hit (the clients' outcomes up to now)."""
    settled = time.monotonic()
    window = [o for o in load.outcomes if o.ended and o.ended >= at and o.sent <= settled]
    failed = [o for o in window if o.end in ("framed", "cut") and o.sent <= back]
    after = [o for o in window if o.end in ("framed", "cut") and o.sent > back]
    return {
        "fault": kind, "in_flight": in_flight, "failed": len(failed),
        "framed": sum(o.end == "framed" for o in failed),
        "named": sum(any(c in o.message for c in CAUSES[kind]) for o in failed),
        "answered_s": max((o.ended - at for o in failed), default=0.0),
        "around_s": max((o.sent - at for o in failed if o.sent > at), default=0.0),
        "replaced_s": back - at, "after": len(after),
        "served": sum(o.end == "complete" for o in window),
        "said": dict(Counter(o.message[:80] for o in failed)),
        # sent before the recovery and still without an answer 5 s after it
        "hung": sum(not o.ended and o.sent <= back for o in load.outcomes),
    }


def run_once(args: argparse.Namespace, url: str, nodes: LocalNodes | None
             ) -> list[dict[str, Any]]:
    deploy(args, nodes)
    load = Load(url, args.clients)
    thread = load.run()
    rows = []
    try:
        for kind in args.faults.split(","):
            rows.append(fault(kind, load, args, nodes))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        load.stop.set()
        thread.join(120)
    before = [o for o in load.outcomes if o.ended and o.end in ("framed", "cut")]
    if not rows or len(before) != sum(r["failed"] + r["after"] for r in rows):
        print(f"note: {len(before)} failed requests in all", file=sys.stderr)
    return rows


def cell(values: list[float], digits: int) -> str:
    mid = statistics.median(values)
    text = f"{mid:.{digits}f}"
    if len(values) > 1:
        text += f" ({min(values):.{digits}f}-{max(values):.{digits}f})"
    return text


COLUMNS = [("in flight", "in_flight", 0), ("failed", "failed", 0), ("framed", "framed", 0),
           ("cause named", "named", 0),
           ("answered s", "answered_s", 1), ("around s", "around_s", 1),
           ("replaced s", "replaced_s", 1), ("after", "after", 0), ("served", "served", 0)]


def markdown(runs: list[list[dict[str, Any]]]) -> str:
    lines = ["| fault | " + " | ".join(c for c, _, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for kind in [r["fault"] for r in runs[0]]:
        rows = [r for run in runs for r in run if r["fault"] == kind]
        lines.append(f"| {kind} | " + " | ".join(
            cell([float(r[key]) for r in rows], digits) for _, key, digits in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--faults", default=",".join(FAULTS[:3]),
                        help=f"some of {','.join(FAULTS)} (node-kill and node-stop run a "
                        "two-node cluster)")
    parser.add_argument("--stop-s", type=float, default=20.0,
                        help="seconds a stopped replica stays stopped at least")
    parser.add_argument("--json", help="also write every run's rows to this file")
    parser.add_argument("--trials", type=int, default=20, help="freeze-retry: trials")
    parser.add_argument("--burst", type=int, default=4,
                        help="freeze-retry: calls sent at once before each freeze")
    args = parser.parse_args()
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"--faults: unknown {', '.join(sorted(unknown))}; one of {FAULTS}")
    if len({"node-kill", "node-stop"} & set(args.faults.split(","))) > 1:
        parser.error("--faults: node-kill and node-stop each need a replica on the worker "
                     "node; run them one at a time")
    if "freeze-retry" in args.faults.split(",") and args.faults != "freeze-retry":
        parser.error("--faults: freeze-retry runs alone (its own deployment)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cpus = 4 * args.replicas + 4
    on_nodes = {"node-kill", "node-stop"} & set(args.faults.split(","))
    nodes = LocalNodes(cpus) if on_nodes else None
    if nodes is not None:
        nodes.add()
    ray.init(address=None if nodes is None else nodes.address,
             num_cpus=cpus if nodes is None else None, namespace="serve",
             log_to_driver=False, logging_level="error")
    # The proxy on the head alone: the worker node's would share this machine's port, and
    # die with it.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    runs = []
    try:
        if args.faults == "freeze-retry":
            summary = freeze_retry(f"http://127.0.0.1:{port}", args.replicas, args.trials,
                                   args.burst, args.json)
            print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
            return 0
        for _ in range(args.runs):
            runs.append(run_once(args, f"http://127.0.0.1:{port}", nodes))
    finally:
        serve.shutdown()
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()
    print(f"{args.replicas} replicas, {args.clients} clients, {len(runs)} run(s)")
    print(markdown(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
