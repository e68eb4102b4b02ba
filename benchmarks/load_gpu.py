"""Many users at once: N README requests sent together (distinct seeds, 50 ms apart) to one
``sgl-omni serve``, for N = 1, 2, 4, 8, with and without a deadline (a second server with
``stages.orchestrator.factory.timeout_s``, ``--deadline-s``: 150 s by default).

Per request: its latency and status, when its first segment arrived, and its timeline from the
request's log line (``timeline=stage.span:seconds,...``, docs/interleaved.md "Where the time
goes"), with its waits (``generation.wait``: waiting for the generation stage, which serves
one request at a time, the oldest first; ``reasoner.wait``). Per N: the latencies by arrival,
the oldest request's latency over the request alone (N = 1), the mean latency, the makespan
(the first send to the last answer), whether requests finished in arrival order, and the GPU's
busy share over the makespan (``nvidia-smi`` utilization sampled every 0.25 s; null without a
GPU).

Servers: ``--placement one-gpu|two-gpu`` with ``--checkpoint`` (the hf backend at Nano's
size, the config ``serve_gpu.py`` writes), or ``--config FILE`` (any config: on the CPU,
``configs/cpu-scripted.yaml``, where the request is a scripted one of the README's shape: an
image, a video, an image, then the answer, each Reasoner turn ``--scripted-turn-s`` long).
``--serve-from DIR`` serves an older checkout (old and new side by side, as ``run_gpu.sh``'s
``BASELINE`` does).

    python benchmarks/load_gpu.py --placement one-gpu --checkpoint /tmp/nano \\
        --out benchmarks/results/load_one_gpu.json
    python benchmarks/load_gpu.py --config configs/cpu-scripted.yaml --quick \\
        --out /tmp/load_cpu.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_gpu import (  # noqa: E402
    README_PROMPT,
    child_env,
    health,
    wait_stages_quiet,
    write_config,
)
from serve_kit import REPO, LogTail, Server, http_client, sse_request  # noqa: E402

#: The request's log line (``sglang_omni.access``): its status and timeline.
ACCESS = re.compile(r"request rid=(\S+) .*?status=(\d+).* timeline=(\S+)")
SEND_GAP_S = 0.05
FIRST_SEED = 100


class BusySampler:
    """The GPUs' utilization (``nvidia-smi``, percent) every ``every_s``, with sample times."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.available = shutil.which("nvidia-smi") is not None
        self.stop = threading.Event()
        self.every_s = every_s
        if self.available:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=10).stdout
                row = {int(i): float(u) for i, u in (line.split(",") for line in
                                                      out.splitlines() if line.strip())}
                self.samples.append((time.time(), row))
            except (ValueError, subprocess.SubprocessError, OSError):
                pass
            time.sleep(self.every_s)

    def busy(self, start: float, end: float) -> tuple[float | None, dict[int, float]]:
        """The mean utilization between ``start`` and ``end``: over the GPUs, and per GPU."""
        rows = [row for at, row in self.samples if start <= at <= end]
        if not rows:
            return None, {}
        per_gpu = {g: round(statistics.mean(r[g] for r in rows if g in r), 1)
                   for g in sorted({g for r in rows for g in r})}
        return round(statistics.mean(per_gpu.values()), 1), per_gpu


def scripted_prompt(turn_s: float) -> str:
    """A scripted request of the README's shape (image, video, image, then the answer)."""
    script = [{"action": "image", "prompt": "a red cube", "delay_s": turn_s},
              {"action": "video", "prompt": "the red cube rotating", "delay_s": turn_s},
              {"action": "image", "prompt": "a blue cube", "delay_s": turn_s},
              {"action": "final", "text": "compared: {media}", "delay_s": turn_s}]
    return f"<omni-script>{json.dumps(script)}</omni-script> {README_PROMPT}"


class Load:
    """One server; runs N requests at once and reads what each one took."""

    def __init__(self, server: Server, tail: LogTail, busy: BusySampler, prompt: str,
                 options: dict[str, Any]) -> None:
        self.server, self.tail, self.busy = server, tail, busy
        self.prompt, self.options = prompt, options

    def one(self, rid: str, seed: int, client: Any, out: dict[str, Any]) -> None:
        body: dict[str, Any] = {"prompt": self.prompt, "stream": True, "rid": rid,
                                "stage_params": {"generation": {**self.options, "seed": seed}}}
        try:
            result = sse_request(f"{self.server.url}/generate", body, client=client)
        except Exception as exc:  # noqa: BLE001 - the other requests' figures stay
            out.update(rid=rid, error=f"{type(exc).__name__}: {exc}")
            return
        media = [e["t"] for e in result["events"] if e.get("kind") in ("image", "video")]
        errors = [e.get("error") for e in result["events"] if e.get("event") == "error"]
        if "error_body" in result:  # refused before any work (503 at admission, 400, ...)
            body_error = result["error_body"]
            errors.insert(0, body_error.get("error", {}).get("message", body_error)
                          if isinstance(body_error, dict) else body_error)
        out.update(rid=rid, seed=seed, status=result["status"],
                   started=result["started"], latency_s=result["wall_s"],
                   ended=result["started"] + result["wall_s"],
                   first_segment_s=media[0] if media else None,
                   segments=len(media), error=errors[0] if errors else None)

    def round(self, n: int, timeout_s: float | None, label: str,
              alone_s: float | None) -> dict[str, Any]:
        """N requests, sent ``SEND_GAP_S`` apart; the figures of the round."""
        self.wait_quiet()
        start_mark = self.tail.mark()
        results: list[dict[str, Any]] = [{} for _ in range(n)]
        clients = [http_client() for _ in range(n)]  # made first: each send is only the POST
        threads = []
        for i in range(n):
            rid = f"load-{label}-n{n}-{i}"
            thread = threading.Thread(target=self.one, args=(rid, FIRST_SEED + i, clients[i],
                                                             results[i]))
            thread.start()
            threads.append(thread)
            time.sleep(SEND_GAP_S)
        for thread in threads:
            thread.join()
        for client in clients:
            client.close()
        time.sleep(0.5)  # the last request log lines
        lines = {}
        for _at, _source, message in self.tail.since(start_mark):
            if m := ACCESS.search(message):
                lines[m.group(1)] = (int(m.group(2)), m.group(3))
        for r in results:
            if r.get("rid") in lines:
                status, timeline = lines[r["rid"]]
                r["logged_status"] = status
                if timeline != "-":
                    spans = {k: round(float(v), 3) for k, v in
                             (item.rsplit(":", 1) for item in timeline.split(","))}
                    r["timeline"] = spans
                    r["waits_s"] = {k: v for k, v in spans.items() if k.endswith(".wait")}
        ok = [r for r in results if "latency_s" in r]
        begin = min((r["started"] for r in ok), default=time.time())
        end = max((r["ended"] for r in ok), default=begin)
        busy, per_gpu = self.busy.busy(begin, end)
        latencies = [r.get("latency_s") for r in results]
        finished = sorted(range(n), key=lambda i: results[i].get("ended", float("inf")))
        served = [r["latency_s"] for r in ok if r.get("status") == 200]
        for r in results:
            if "started" in r:
                r["sent_at_s"] = round(r.pop("started") - begin, 3)
                r["ended_at_s"] = round(r.pop("ended") - begin, 3)
        return {"n": n, "timeout_s": timeout_s, "statuses": [r.get("status") for r in results],
                "latencies_s": latencies,
                "oldest_over_alone": round(latencies[0] / alone_s, 3)
                if alone_s and latencies[0] else None,
                "mean_latency_s": round(statistics.mean(served), 3) if served else None,
                "makespan_s": round(end - begin, 3),
                "finish_order": finished, "in_arrival_order": finished == list(range(n)),
                "gpu_busy_pct": busy, "gpu_busy_pct_by_gpu": per_gpu,
                "requests": results}

    def wait_quiet(self, timeout: float = 300) -> None:
        """Until no stage job is in flight (``/metrics``), so one round does not overlap the
        next."""
        wait_stages_quiet(self.server.url, timeout, jobs_seen=False)


def gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    ns = [int(n) for n in args.ns.split(",") if n]
    figures: dict[str, Any] = {"gpus": gpu_names(), "ns": ns, "deadline_s": args.deadline_s,
                               "quick": args.quick, "send_gap_s": SEND_GAP_S}
    work = Path(tempfile.mkdtemp(prefix="load-gpu-"))
    server_args: list[str] = []
    if args.config:
        config = Path(args.config).resolve()
        figures["config"] = str(config)
        prompt = scripted_prompt(args.scripted_turn_s)
        server_args += ["--generation.factory.step_time_s", str(args.scripted_step_s)]
    else:
        if not args.checkpoint:
            raise SystemExit("--checkpoint is needed with --placement (or give --config)")
        config = work / "config.yaml"
        write_config(config, Path(args.checkpoint), args.placement)
        figures.update(placement=args.placement, checkpoint=args.checkpoint)
        prompt = README_PROMPT
    options = ({"width": 64, "height": 64, "num_frames": 5, "num_inference_steps": 2}
               if args.quick else {"width": 640, "height": 640})  # README: default 35 steps
    figures["generation_options"] = options
    serve_from = Path(args.serve_from).resolve() if args.serve_from else REPO
    figures["served_from"] = str(serve_from)
    busy = BusySampler()
    alone_s: float | None = None
    try:
        for key, timeout_s in (("by_n", None), ("with_deadline", args.deadline_s)):
            if timeout_s is None and args.skip_no_deadline or \
                    timeout_s is not None and timeout_s <= 0:
                continue
            deadline = ["--orchestrator.factory.timeout_s", str(timeout_s)] if timeout_s else []
            log_path = Path(f"{args.log}.{key}" if args.log else work / f"server_{key}.log")
            server = Server(config, log_path, child_env(serve_from), cwd=serve_from,
                            args=(*server_args, *deadline))
            tail = LogTail(log_path)
            try:
                started_s = round(server.wait_ready(args.start_timeout), 2)
                figures.setdefault("server_start_s", started_s)
                figures.setdefault("server_starts_s", []).append(started_s)
                load = Load(server, tail, busy, prompt, options)
                rounds: dict[str, Any] = {}
                for n in ns:
                    result = load.round(n, timeout_s, "d" if timeout_s else "free", alone_s)
                    if n == 1 and timeout_s is None and result["latencies_s"][0]:
                        alone_s = result["latencies_s"][0]
                        result["oldest_over_alone"] = 1.0
                    rounds[str(n)] = result
                    print(f"== {key} N={n}: latencies {result['latencies_s']} statuses "
                          f"{result['statuses']} makespan {result['makespan_s']} s, busy "
                          f"{result['gpu_busy_pct']}%", flush=True)
                figures[key] = rounds
                figures[f"health_after_{key}"] = health(server.url)
            finally:
                server.stop()
                tail.stop.set()
                figures[f"server_exit_code_{key}"] = server.proc.returncode
        figures["alone_s"] = alone_s
    finally:
        busy.stop.set()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--placement", choices=["one-gpu", "two-gpu", "cpu"], default="one-gpu")
    parser.add_argument("--checkpoint", help="the Nano checkpoint (serve_gpu.py builds it)")
    parser.add_argument("--config", help="serve this config instead (e.g. "
                        "configs/cpu-scripted.yaml: a scripted request of the README's shape)")
    parser.add_argument("--ns", default="1,2,4,8", help="how many requests at once, per round")
    parser.add_argument("--deadline-s", type=float, default=150.0,
                        help="the deadline rounds' server runs with this "
                        "stages.orchestrator.factory.timeout_s (0: no deadline rounds)")
    parser.add_argument("--skip-no-deadline", action="store_true",
                        help="only the deadline rounds (N=1 alone is then not measured)")
    parser.add_argument("--quick", action="store_true", help="64x64, 5 frames, 2 steps")
    parser.add_argument("--scripted-turn-s", type=float, default=0.2,
                        help="with --config: each scripted Reasoner turn's seconds")
    parser.add_argument("--scripted-step-s", type=float, default=0.1,
                        help="with --config: each scripted denoising step's seconds")
    parser.add_argument("--serve-from", help="serve another checkout's sglang_omni (old and "
                        "new side by side)")
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--out", help="write the JSON figures here")
    parser.add_argument("--log", help="keep the server logs here (LOG.by_n, LOG.with_deadline)")
    args = parser.parse_args()
    figures = run(args)
    text = json.dumps(figures, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    summary = {k: {n: {f: r[f] for f in ("latencies_s", "oldest_over_alone", "mean_latency_s",
                                         "makespan_s", "gpu_busy_pct", "in_arrival_order")}
                   for n, r in figures.get(k, {}).items()} for k in ("by_n", "with_deadline")}
    print(json.dumps({"server_start_s": figures.get("server_start_s"), **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
