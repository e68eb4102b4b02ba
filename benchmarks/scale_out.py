"""Scale out on Ray Serve: 1, 2 and 4 replicas under Poisson load, by router.

Usage: python benchmarks/scale_out.py [--duration 60] [--replicas 1,2,4] [--loads 0.5,1,2]
       [--routers deadline,pow2,round_robin] [--step-time 0.05] [--timeout 10] [--seed 7]
       [--repeats 1]

Starts a local Ray instance, deploys the interleaved pipeline with the scripted engines
(``configs/cpu-scripted.yaml``; generation ``step_time_s`` = ``--step-time``, so generations take
real time without using the CPU; ``timeout_s`` = ``--timeout``, the deadline: a comma-separated
list runs each) on each replica count with each router, and offers each load: Poisson arrivals at
``load`` x the cluster's generation capacity (``replicas`` / the mean generation-stage seconds of
a request) for ``--duration`` seconds, then waits for every request to end. ``--repeats N`` runs
each point on N traces (seeds ``--seed`` .. ``--seed``+N-1, the same for every router) and
reports them together. A request is one modality (image 60 %, video 40 %; an image is 4
denoising steps, a video 12) and 0-8 generations (uniform), streamed from ``/generate``.

``deadline`` is the deadline-aware router with 503 retries and requests waiting at the gateway
for a replica that admits them (the defaults of ``sgl-omni serve --ray``; ``deadline+nowait``:
``--max-wait-s 0``); ``pow2`` (Ray's default) and ``round_robin`` run without retries, as Ray
routes; ``pow2+retry`` adds our retries to Ray's router. One replica is run with ``deadline``
only (the routers agree there).

Columns: ``thr/s`` completed requests per second of the run (arrivals and drain); ``goodput/s``
those completed before their deadline (``timeout_s`` after arrival); ``p50``/``p99`` latency of
completed requests (s); ``503`` the share of requests answered 503 (refused at admission, after
retries); ``ff`` requests failed fast after admission (503 in the stream); ``gens/s`` the images and
videos those completed in time delivered per second; ``cut`` the share of the generations the
completed requests asked for that they did not get (a plan lowered under them answers with a
receipt instead); ``t/o`` admitted
requests that timed out; ``idle|q`` the generation stages' idle share of the time a generation
was queued (summed over replicas, from their routing stats); ``busy`` the generation stages' busy
share of the run (a generation running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from sglang_omni.scale.builder import build
from sglang_omni.scale.launch import replica_stats
from sglang_omni.scale.spec import ScaleOptions, ServerSource

ROOT = Path(__file__).parents[1]
CONFIG = ROOT / "configs" / "cpu-scripted.yaml"
APP = "omni"
STEPS = {"image": 4, "video": 12}
VIDEO_SHARE = 0.4
MAX_GENERATIONS = 8
MEDIA_SEGMENT = re.compile(r'^event: segment\ndata: \{.*"kind": "(?:image|video)"',
                           re.MULTILINE)


@dataclass(frozen=True)
class Spec:
    at: float  # seconds after the start
    modality: str
    generations: int
    seed: int


@dataclass
class Outcome:
    status: int = 0  # HTTP status; 200 for a stream
    end: str = ""  # complete, failfast, timeout, error, refused, transport
    latency: float = 0.0
    wanted: int = 0  # generations the request's script asks for
    made: int = 0  # image and video segments it got


@dataclass
class Point:
    replicas: int
    router: str
    load: float
    timeout_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    span_s: float = 0.0
    idle_queued: float = 0.0
    queued: float = 0.0
    busy: float = 0.0


def mean_stage_s(step_time: float) -> float:
    """Mean generation-stage seconds of one request of the mix."""
    per_generation = ((1 - VIDEO_SHARE) * STEPS["image"] + VIDEO_SHARE * STEPS["video"]) \
        * step_time
    return MAX_GENERATIONS / 2 * per_generation


def trace(rate: float, duration: float, rng: random.Random) -> list[Spec]:
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        modality = "video" if rng.random() < VIDEO_SHARE else "image"
        out.append(Spec(t, modality, rng.randint(0, MAX_GENERATIONS), rng.randrange(1 << 30)))


def body(spec: Spec) -> dict[str, Any]:
    entries: list[Any] = [{"action": spec.modality, "prompt": f"p{i}"}
                          for i in range(spec.generations)]
    entries.append({"action": "final", "text": "done"})
    options = {"width": 32, "height": 32, "num_frames": 3, "seed": spec.seed,
               "num_inference_steps": STEPS[spec.modality]}
    return {"prompt": f"<omni-script>{json.dumps(entries)}</omni-script> go", "stream": True,
            "stage_params": {"generation": options}}


async def one(client: httpx.AsyncClient, url: str, spec: Spec, start: float) -> Outcome:
    await asyncio.sleep(max(0.0, start + spec.at - time.monotonic()))
    sent = time.monotonic()
    out = Outcome(wanted=spec.generations)
    try:
        async with client.stream("POST", f"{url}/generate", json=body(spec)) as resp:
            out.status = resp.status_code
            text = (await resp.aread()).decode()
    except httpx.HTTPError:
        out.end = "transport"
        return out
    out.latency = time.monotonic() - sent
    out.made = len(MEDIA_SEGMENT.findall(text))
    if out.status == 503:
        out.end = "refused"
    elif out.status != 200:
        out.end = "error"
    elif "event: complete" in text:
        out.end = "complete"
    elif '"code": 503' in text:
        out.end = "failfast"
    elif '"code": 504' in text:
        out.end = "timeout"
    else:
        out.end = "error"
    return out


def stage_totals() -> tuple[float, float, float]:
    stats = replica_stats(APP)
    return (sum(s["idle_queued_s"] for s in stats), sum(s["queued_s"] for s in stats),
            sum(s["busy_s"] for s in stats))


async def run_load(url: str, point: Point, rate: float, args: argparse.Namespace,
                   seed: int) -> None:
    """Offer one trace (``seed``) and add what happened to ``point``."""
    specs = trace(rate, args.duration, random.Random(f"{seed}-{point.replicas}-{point.load}"))
    idle0, queued0, busy0 = stage_totals()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=point.timeout_s + 60, limits=limits) as client:
        start = time.monotonic()
        point.outcomes += await asyncio.gather(*(one(client, url, s, start) for s in specs))
        point.span_s += time.monotonic() - start
    idle1, queued1, busy1 = stage_totals()
    point.idle_queued += idle1 - idle0
    point.queued += queued1 - queued0
    point.busy += busy1 - busy0


def deploy(replicas: int, router: str, timeout_s: float, args: argparse.Namespace) -> None:
    if APP in serve.status().applications:
        serve.delete(APP)
    name, _, variant = router.partition("+")
    overrides = {"generation.factory.step_time_s": args.step_time,
                 "orchestrator.factory.timeout_s": timeout_s,
                 "orchestrator.factory.max_active": 64}
    source = ServerSource.from_file(CONFIG, overrides)
    retries = None if name == "deadline" or variant == "retry" else 0
    max_wait_s = 0.0 if variant == "nowait" else 30.0
    serve.run(build(source, ScaleOptions(replicas=replicas, router=name, retries=retries,
                                         max_wait_s=max_wait_s)),
              name=APP, route_prefix="/")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stats = replica_stats(APP)
        if len(stats) == replicas and all(s["health"] == "ok" for s in stats):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{replicas} replicas not healthy in 120 s")


async def warm(url: str, replicas: int) -> None:
    """Each replica measures an image and a video before the plan is used."""
    spec = [Spec(0.0, "image", 1, 1), Spec(0.0, "video", 1, 2)]
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(3):
            await asyncio.gather(*(one(client, url, s, time.monotonic())
                                   for s in spec * replicas))
            stats = replica_stats(APP)
            if all(s["quote"] and s["quote"]["generation_s"] for s in stats):
                return


def row(p: Point) -> dict[str, Any]:
    done = [o for o in p.outcomes if o.end == "complete"]
    good = [o for o in done if o.latency <= p.timeout_s]
    lat = sorted(o.latency for o in done)
    n = max(1, len(p.outcomes))
    return {
        "replicas": p.replicas, "timeout_s": p.timeout_s, "router": p.router, "load": p.load,
        "requests": len(p.outcomes),
        "completed": len(done), "thr/s": len(done) / p.span_s if p.span_s else 0.0,
        "goodput/s": len(good) / p.span_s if p.span_s else 0.0,
        "gens/s": sum(o.made for o in good) / p.span_s if p.span_s else 0.0,
        "cut": 1 - sum(o.made for o in done) / max(1, sum(o.wanted for o in done)),
        "p50": statistics.median(lat) if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
        "503": sum(o.end == "refused" for o in p.outcomes) / n,
        "ff": sum(o.end == "failfast" for o in p.outcomes),
        "t/o": sum(o.end == "timeout" for o in p.outcomes),
        "errors": sum(o.end in ("error", "transport") for o in p.outcomes),
        "idle|q": p.idle_queued / p.queued if p.queued else 0.0,
        "busy": p.busy / (p.span_s * p.replicas) if p.span_s else 0.0,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["replicas", "timeout_s", "router", "load", "requests", "thr/s", "goodput/s",
            "gens/s", "cut", "p50", "p99", "503", "ff", "t/o", "errors", "idle|q", "busy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = []
        for k in head:
            v = r[k]
            if k in ("503", "cut", "idle|q", "busy"):
                cells.append(f"{100 * v:.1f}%")
            elif isinstance(v, float) and k not in ("load", "timeout_s"):
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--loads", default="0.5,1,2")
    parser.add_argument("--routers", default="deadline,pow2,round_robin")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--timeout", default="10",
                        help="timeout_s (the deadline), or several, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=1, help="traces per point")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    replica_counts = [int(x) for x in args.replicas.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    timeouts = [float(x) for x in args.timeout.split(",")]
    routers = args.routers.split(",")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    ray.init(num_cpus=4 * max(replica_counts) + 4, namespace="serve", log_to_driver=False,
             logging_level="error")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    per_request = mean_stage_s(args.step_time)
    print(f"mean generation-stage time of a request {per_request:.2f} s; capacity "
          f"{1 / per_request:.3f} requests/s a replica; timeout_s {args.timeout}",
          file=sys.stderr, flush=True)
    rows = []
    try:
        for n in replica_counts:
            for timeout_s in timeouts:
                for router in (routers[:1] if n == 1 else routers):
                    deploy(n, router, timeout_s, args)
                    asyncio.run(warm(url, n))
                    for load in loads:
                        point = Point(n, router, load, timeout_s)
                        for seed in range(args.seed, args.seed + args.repeats):
                            asyncio.run(run_load(url, point, load * n / per_request, args, seed))
                        rows.append(row(point))
                        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr,
                              flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
