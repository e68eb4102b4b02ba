"""The whole server on GPUs: ``sgl-omni serve`` (hf backend) on a Nano-sized random checkpoint,
driven over HTTP.

Builds the checkpoint if it is missing (``sgl-omni make-checkpoint --shape nano``), starts the real
server with the interleaved pipeline on one placement, and measures:

* server start (stage load and warm-up, from the stages' own log lines);
* the README's interleaved request (640x640 images, 35 steps) twice: the first after ``/health``
  turned ready, then again; time to first segment, each Reasoner turn, each generation, end to
  end;
* a 33-frame 1280x720 video request with 35 steps and a text-only chat (see "random weights");
* an abort through a client disconnect mid-video, from the disconnect to the stage's job ending;
* the CPU time of each request in the server's own processes (everything but the two model
  stages: what Omni costs next to the GPU work) and in each stage;
* peak GPU memory per stage (the stage's torch allocator peak from its log lines, and the
  driver's per-process figure sampled with nvidia-smi);
* where each request's time went: its log line's timeline (docs/interleaved.md, "Where the time
  goes"), the model's seconds (prefill, decode, denoising, VAE decode) and their share of the
  wall time (``model_s``, ``model_share``).

Random weights: the Reasoner's decisions come from random weights, so a request cannot ask for a
video or a text-only answer. Those two requests sample their decisions (temperature 1, seeds 0,
1, ...) and the script probes seeds until the first decision is the wanted one, aborting probes
that started something else; the probes are in the JSON.

Per-turn and per-generation times come from the hf engines' log lines (one per Reasoner turn and
per generation, with the request id). Placements: ``one-gpu`` (both stages on GPU 0, 0.55 and
0.35 of its memory), ``two-gpu`` (the spec's default: generation on GPU 0, the Reasoner on GPU 1),
``cpu`` (both on the CPU: with ``--shape micro --quick`` it checks this script anywhere).

    python benchmarks/serve_gpu.py --placement one-gpu --checkpoint /tmp/nano \\
        --out benchmarks/results/serve_one_gpu.json
    python benchmarks/serve_gpu.py --placement cpu --shape micro --quick --checkpoint /tmp/m
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serve_kit import REPO, CpuClock, GpuSampler, LogTail, Server, sse_request

README_PROMPT = ("Create an image of a red cube, inspect it, then create a blue cube and compare "
                 "them.")
VIDEO_PROMPT = "Create a video of a red cube rotating slowly on a wooden table, then describe it."
CHAT_PROMPT = "In one sentence, what color is a ripe banana?"
PLACEMENTS: dict[str, dict[str, Any]] = {
    "one-gpu": {"generation": {"gpu": 0, "gpu_memory_fraction": 0.55},
                "reasoner": {"gpu": 0, "gpu_memory_fraction": 0.35}},
    "two-gpu": {"generation": {}, "reasoner": {}},  # defaults: generation 0, Reasoner 1
    "cpu": {"generation": {"gpu": None}, "reasoner": {"gpu": None}},
}
TURN = re.compile(r"hf reasoner: request (\S+): (\d+) prompt \+ (\d+) new tokens in ([\d.]+) s "
                  r"\(([\d.]+) tokens/s, (\w+)\)(?:; peak ([\d.]+) GiB)?")
GEN_START = re.compile(r"hf generator: request (\S+): (\w+) (\d+)x(\d+), (\d+) frames, "
                       r"(\d+) steps \((\w+)\): started")
GEN_DONE = re.compile(r"hf generator: request (\S+): denoised and decoded in ([\d.]+) s"
                      r"(?:; peak ([\d.]+) GiB)?")
#: The request's log line (``sglang_omni.access``) with its timeline (``pipeline.timeline``).
ACCESS = re.compile(r"request rid=(\S+) .* timeline=(\S+)")
#: The model's own compute among the timeline's spans (``pipeline.timeline.MODEL_SPANS``).
MODEL_SPANS = ("prefill", "decode", "denoise", "vae_decode")
#: A stage's ready line: seconds since its process started, before its engine, in its start.
READY = re.compile(r"ready \(backend \w+\) ([\d.]+) s after the process started: ([\d.]+) s "
                   r"to reach the engine, ([\d.]+) s in the engine's start")
#: ... and, where the checkout logs them, its engine's start in parts (``name S s, ...``).
PARTS = re.compile(r"in the engine's start \((.*\d s)\)$")
PART = re.compile(r"([\w -]+?) ([\d.]+) s$")
LOADED = re.compile(r"hf (reasoner|generator): .* loaded on .* in ([\d.]+) s, warmed up in "
                    r"([\d.]+) s.*pid (\d+)")


def write_config(path: Path, checkpoint: Path, placement: str) -> None:
    import yaml

    stages: dict[str, Any] = {}
    for stage, fields in PLACEMENTS[placement].items():
        stages[stage] = {**fields, "factory": {"backend": "hf"}}
    # Random weights rarely close a JSON string on their own; the budget's closing rule ends a
    # decision within 128 tokens (the demo uses 96).
    stages["reasoner"]["engine"] = {"max_structured_tokens": 128}
    config = {"config_cls": "Cosmos3UMMPipelineConfig", "model_path": str(checkpoint),
              "stages": stages}
    path.write_text(yaml.safe_dump(config, sort_keys=False))



def wait_stages_quiet(url: str, timeout: float, jobs_seen: bool) -> None:
    """Until no stage job is in flight at the server ``url`` (``/metrics``: submitted =
    completed + failed + aborted + dropped on every stage), or ``timeout`` seconds; with
    ``jobs_seen``, not before some stage job is counted. Returns at once if the server is gone."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:
            return
        counts: dict[str, float] = {}
        for m in re.finditer(r"^sgl_omni_stage_jobs(?:_total)?\{([^}]*)\} (\S+)$", text,
                             re.MULTILINE):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            sign = 1.0 if labels.get("outcome") == "submitted" else -1.0
            stage = labels.get("stage", "")
            counts[stage] = counts.get(stage, 0.0) + sign * float(m.group(2))
        if (counts or not jobs_seen) and all(v <= 0 for v in counts.values()):
            return
        time.sleep(0.1)

class Bench:
    """One server, its log and the measurements of each request."""

    def __init__(self, server: Server, tail: LogTail, gpus: GpuSampler, quick: bool) -> None:
        self.server, self.tail, self.gpus, self.quick = server, tail, gpus, quick
        self.x264_preset: str | None = None  # the video step's, else the server's default
        self.stage_pids: dict[str, int] = {}
        self.stage_load: dict[str, dict[str, float]] = {}
        for _at, source, message in tail.since(0):
            ready = READY.search(message)
            stage = next((s for s in ("reasoner", "generation") if s in source), None)
            if ready and stage:  # where each stage's start-up went
                self.stage_load.setdefault(stage, {}).update(
                    process_to_ready_s=float(ready.group(1)),
                    spawn_and_imports_s=float(ready.group(2)),
                    engine_start_s=float(ready.group(3)))
                if parts := PARTS.search(message):  # the engine's start in parts, if logged
                    self.stage_load[stage]["parts_s"] = {
                        p.group(1): float(p.group(2)) for item in
                        re.split(r", |; beside them: ", parts.group(1))
                        if (p := PART.match(item.strip()))}
            m = LOADED.search(message)
            if m:
                stage = "reasoner" if m.group(1) == "reasoner" else "generation"
                self.stage_pids[stage] = int(m.group(4))
                self.stage_load.setdefault(stage, {}).update(load_s=float(m.group(2)),
                                                             warmup_s=float(m.group(3)))
        self.cpu = CpuClock(server.proc.pid, self.stage_pids)
        self.peaks: dict[str, float] = {}

    def generation_options(self, video: bool) -> dict[str, Any]:
        if self.quick:
            return ({"width": 128, "height": 128, "num_frames": 9, "num_inference_steps": 3}
                    if video else {"width": 64, "height": 64, "num_inference_steps": 2})
        if video:
            return {"width": 1280, "height": 720, "num_frames": 33, "num_inference_steps": 35}
        return {"width": 640, "height": 640}  # the README's request: default 35 steps

    def measure(self, route: str, body: dict[str, Any],
                stop_when: Any = None) -> dict[str, Any]:
        """Run one request; attach the engines' log lines of its rid and its CPU time."""
        rid = body["rid"]
        start = self.tail.mark()
        before = self.cpu.read()
        out = sse_request(f"{self.server.url}{route}", body, stop_when)
        if out["disconnected_at"] is not None:
            self.wait_quiet(rid, start)
        time.sleep(0.3)  # the last log lines of the request
        after = self.cpu.read()
        out["cpu_s"] = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
        out.update(self.engine_lines(rid, start))
        media = [e for e in out["events"] if e.get("kind") in ("image", "video", "text")]
        out["first_segment_s"] = media[0]["t"] if media else None
        out["e2e_s"] = out.pop("wall_s")
        out.update(self.timeline(rid, start, out["e2e_s"]))
        if out["disconnected_at"] is not None:
            out["disconnected_at_s"] = round(out["disconnected_at"] - out["started"], 4)
        del out["started"], out["disconnected_at"]
        out["rid"] = rid
        return out

    def first_generation(self, rid: str, start: int) -> tuple[float, str] | None:
        """When the request's first generation started, and its modality (from the log)."""
        for at, _source, message in self.tail.since(start):
            m = GEN_START.search(message)
            if m and m.group(1) == rid:
                return at, m.group(2)
        return None

    def engine_lines(self, rid: str, start: int) -> dict[str, Any]:
        turns, generations = [], []
        for _at, _source, message in self.tail.since(start):
            if f"request {rid}:" not in message:
                continue
            if m := TURN.search(message):
                turns.append({"prompt_tokens": int(m.group(2)), "new_tokens": int(m.group(3)),
                              "s": float(m.group(4)), "tokens_per_s": float(m.group(5)),
                              "decoder": m.group(6)})
                self._peak("reasoner", m.group(7))
            elif m := GEN_START.search(message):
                generations.append({"modality": m.group(2), "size": f"{m.group(3)}x{m.group(4)}",
                                    "frames": int(m.group(5)), "steps": int(m.group(6)),
                                    "loop": m.group(7)})
            elif (m := GEN_DONE.search(message)) and generations:
                generations[-1]["s"] = float(m.group(2))
                self._peak("generation", m.group(3))
        return {"reasoner_turns": turns, "generations": generations}

    def timeline(self, rid: str, start: int, e2e_s: float) -> dict[str, Any]:
        """Where the request's time went (its log line's ``timeline``), the model's seconds
        (prefill, decode, denoising, VAE decode) and their share of the wall time."""
        for _at, _source, message in self.tail.since(start):
            m = ACCESS.search(message)
            if m is None or m.group(1) != rid or m.group(2) == "-":
                continue
            spans = {k: float(v) for k, v in (item.rsplit(":", 1)
                                              for item in m.group(2).split(","))}
            model_s = sum(v for k, v in spans.items() if k.rsplit(".", 1)[-1] in MODEL_SPANS)
            return {"timeline": spans, "model_s": round(model_s, 3),
                    "model_share": round(model_s / e2e_s, 3) if e2e_s else None}
        return {}

    def _peak(self, stage: str, value: str | None) -> None:
        if value is not None:
            self.peaks[stage] = max(self.peaks.get(stage, 0.0), float(value))

    def interleaved(self, run: int) -> dict[str, Any]:
        body = {"prompt": README_PROMPT, "stream": True, "rid": f"bench-interleaved-{run}",
                "stage_params": {"generation": {**self.generation_options(False), "seed": 7}}}
        return self.measure("/generate", body)

    def probe(self, route: str, make_body: Any, want: str, tries: int) -> dict[str, Any]:
        """Sample decisions with seeds 0, 1, ... until the first decision is ``want``
        (``video``: a video generation starts; ``final``: the reply ends with no generation).
        A probe that starts another generation is aborted by disconnecting; a video probe
        disconnects once its video segment arrived (the video is what it measures)."""
        probes: list[dict[str, Any]] = []
        for seed in range(tries):
            body = make_body(seed)
            start = self.tail.mark()

            def stop_when(events: list[dict[str, Any]], rid: str = body["rid"],
                          start: int = start) -> bool:
                first = self.first_generation(rid, start)
                if first is not None and first[1] != want:
                    return True
                return want == "video" and any(e.get("kind") == "video" for e in events)

            result = self.measure(route, body, stop_when)
            started = [g["modality"] for g in result["generations"]]
            first = started[0] if started else "final"
            probes.append({"seed": seed, "first": first, "e2e_s": result["e2e_s"]})
            if first == want:
                videos = [e["t"] for e in result["events"] if e.get("kind") == "video"]
                result["video_segment_s"] = videos[0] if videos else None
                turns, made = result.get("reasoner_turns") or [], result.get("generations") or []
                if videos and turns and made and made[0].get("s") is not None:
                    # after its generation ended: the encode, the relay and the server
                    result["segment_after_generation_s"] = round(
                        videos[0] - turns[0]["s"] - made[0]["s"], 3)
                result["probes"] = probes
                return result
        return {"probes": probes, "error": f"no seed in {tries} made a first decision {want}"}

    def wait_quiet(self, rid: str, start: int, timeout: float = 120) -> None:
        """Until no stage job is in flight (``/metrics``: submitted = completed + failed +
        aborted + dropped on every stage), so an aborted request does not overlap the next."""
        wait_stages_quiet(self.server.url, timeout, jobs_seen=True)

    def video(self) -> dict[str, Any]:
        options = {**self.generation_options(True), "seed": 7,
                   **({"x264_preset": self.x264_preset} if self.x264_preset else {})}
        return self.probe("/generate", lambda seed: {
            "prompt": VIDEO_PROMPT, "stream": True, "rid": f"bench-video-{seed}",
            "temperature": 1.0, "seed": seed, "stage_params": {"generation": options}},
            "video", 12)

    def chat(self) -> dict[str, Any]:
        options = self.generation_options(False)
        return self.probe("/v1/chat/completions", lambda seed: {
            "messages": [{"role": "user", "content": CHAT_PROMPT}], "stream": True,
            "rid": f"bench-chat-{seed}", "temperature": 1.0, "seed": seed,
            "stage_params": {"generation": options}}, "final", 12)

    def abort(self, seed: int, after_s: float) -> dict[str, Any]:
        """The video request of ``seed`` again; disconnect ``after_s`` after its video started;
        time the disconnect to the generation's cancel line and to the stage's job end."""
        rid = f"bench-abort-{seed}"
        options = {**self.generation_options(True), "seed": 7}
        body = {"prompt": VIDEO_PROMPT, "stream": True, "rid": rid, "temperature": 1.0,
                "seed": seed, "stage_params": {"generation": options}}
        start = self.tail.mark()

        def stop_when(events: list[dict[str, Any]]) -> bool:
            first = self.first_generation(rid, start)
            return first is not None and (first[1] != "video" or time.time() >= first[0] + after_s)

        out = sse_request(f"{self.server.url}/generate", body, stop_when)
        result: dict[str, Any] = {"rid": rid, "after_video_start_s": after_s}
        first = self.first_generation(rid, start)
        result["first_generation"] = first[1] if first else None
        disconnected = out["disconnected_at"]
        if disconnected is None:
            result["error"] = "the request ended before the disconnect"
            return result
        # The server notices the disconnect and aborts the stage job; the stage receives the
        # abort; the job ends when the model thread stops at the end of the step in flight.
        seen = self.tail.wait(re.compile(r"cancelled; aborting its job"), start, 120, rid=rid)
        received = self.tail.wait(re.compile(r"request \S+ aborted"), start, 120, rid=rid)
        ended = self.tail.wait(re.compile(r"generation cancelled after step (\d+) of (\d+)"),
                               start, 120, rid=rid)
        if seen:
            result["disconnect_to_server_abort_s"] = round(seen[0] - disconnected, 3)
        if received:
            result["disconnect_to_stage_abort_s"] = round(received[0] - disconnected, 3)
        if ended:
            result["disconnect_to_job_end_s"] = round(ended[0] - disconnected, 3)
            result["cancelled_after_step"] = f"{ended[1].group(1)} of {ended[1].group(2)}"
        return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    figures: dict[str, Any] = {"placement": args.placement, "shape": args.shape,
                               "quick": args.quick, "torch": torch.__version__,
                               "gpus": [torch.cuda.get_device_name(i)
                                        for i in range(torch.cuda.device_count())]}
    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "model_index.json").is_file():
        started = time.time()
        built = subprocess.run([sys.executable, "-m", "sglang_omni", "make-checkpoint",
                                "--shape", args.shape, str(checkpoint)], cwd=str(REPO),
                               env=child_env(), capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"make-checkpoint failed: {built.stderr[-2000:]}")
        figures["checkpoint_build_s"] = round(time.time() - started, 1)
    figures["checkpoint_gb"] = round(sum(p.stat().st_size for p in checkpoint.rglob("*")
                                         if p.is_file()) / 1e9, 2)
    work = Path(tempfile.mkdtemp(prefix="serve-gpu-"))
    config, log_path = work / "config.yaml", Path(args.log or work / "server.log")
    write_config(config, checkpoint, args.placement)
    gpus = GpuSampler()
    serve_from = Path(args.serve_from).resolve() if args.serve_from else REPO
    figures["served_from"] = str(serve_from)
    server = Server(config, log_path, child_env(serve_from), cwd=serve_from)
    tail = LogTail(log_path)
    try:
        figures["server_start_s"] = round(server.wait_ready(args.start_timeout), 2)
        time.sleep(0.5)
        bench = Bench(server, tail, gpus, args.quick)
        bench.x264_preset = args.x264_preset
        figures["stage_load"] = bench.stage_load
        steps: list[tuple[str, Any]] = [
            ("interleaved_first", lambda: bench.interleaved(1)),
            ("interleaved_again", lambda: bench.interleaved(2)),
            ("video", bench.video),
            ("chat", bench.chat),
            ("abort", lambda: bench.abort(next(
                (p["seed"] for p in figures.get("video", {}).get("probes", [])
                 if p["first"] == "video"), 0), 1.0 if args.quick else 4.0)),
        ]
        for name, step in steps:
            if args.only and name not in args.only.split(","):
                continue
            figures[name] = guarded(step)
            print(f"== {name}: {short(figures[name])}", flush=True)
        figures["gpu_memory"] = {
            "torch_peak_gib": bench.peaks,
            "nvidia_smi_peak_mib_per_stage": {
                stage: gpus.per_pid.get(pid) for stage, pid in bench.stage_pids.items()},
            "nvidia_smi_peak_mib_per_gpu": gpus.per_gpu}
        figures["health_after"] = health(server.url)
    finally:
        gpus.stop.set()
        server.stop()
        tail.stop.set()
        figures["server_exit_code"] = server.proc.returncode
    return figures


def guarded(step: Any) -> dict[str, Any]:
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - keep what the other steps measured
        return {"error": f"{type(exc).__name__}: {exc}"}


def health(url: str) -> Any:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=5).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)}


def short(result: dict[str, Any]) -> str:
    keys = ("error", "e2e_s", "model_s", "model_share", "first_segment_s", "video_segment_s",
            "disconnect_to_server_abort_s", "disconnect_to_job_end_s", "cancelled_after_step")
    brief = {k: result[k] for k in keys if result.get(k) is not None}
    brief["turns"] = len(result.get("reasoner_turns", []))
    brief["generations"] = len(result.get("generations", []))
    if result.get("timeline"):
        brief["timeline"] = result["timeline"]
    return json.dumps(brief)


def child_env(serve_from: Path = REPO) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(serve_from), env.get("PYTHONPATH"))
                                        if p)
    env.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--placement", choices=sorted(PLACEMENTS), default="one-gpu")
    parser.add_argument("--checkpoint", required=True, help="built here when missing")
    parser.add_argument("--shape", default="nano", choices=["nano", "micro", "tiny"])
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps")
    parser.add_argument("--out", help="write the JSON figures here")
    parser.add_argument("--log", help="keep the server log here")
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--serve-from", help="serve another checkout's sglang_omni (an older "
                        "commit, for a side-by-side run); this script and its checks stay")
    parser.add_argument("--x264-preset", help="the video step's x264_preset (else the "
                        "server's default)")
    parser.add_argument("--only", help="run only these steps (comma-separated: "
                        "interleaved_first, interleaved_again, video, chat, abort)")
    args = parser.parse_args()
    figures = run(args)
    text = json.dumps(figures, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
