#!/usr/bin/env python3
"""Qualify the native backends on a GPU host that has the Cosmos3 Nano checkpoint.

Starts ``sgl-omni serve`` on the checkpoint, runs every check of the selected sections against
it over HTTP and prints a pass/fail table; the exit code is 0 only when every check passed.

    python scripts/qualify_native.py --model-path /path/to/Cosmos3-Nano
    python scripts/qualify_native.py --model-path P --reasoner-gpu 1 --only streaming

Sections: ``reasoner`` (``--text-only``: text chat, image chat, streaming, abort mid-stream, 503
beyond the admission sum); ``generation`` (direct generation on ``--generation-gpu``: image,
video, abort mid-video, and last a killed native worker). The generation section has not yet run
on real hardware. A section is a server configuration plus its checks; add one to
``SECTIONS`` to qualify another stage. Each check gets the running server and returns a short
detail on success or raises ``CheckFailed``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CHAT = "/v1/chat/completions"
#: Admission limits the reasoner section starts the server with (503 beyond their sum).
MAX_RUNNING, MAX_QUEUED = 1, 1
#: A request long enough to be cancelled or to hold an admission slot.
LONG = {"max_tokens": 2048, "stage_params": {"reasoner": {"ignore_eos": True}}}


class CheckFailed(Exception):
    """A check's expectation did not hold; the message says which."""


@dataclass
class Server:
    """A running ``sgl-omni serve`` and its log."""

    url: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metric(self, stage: str, outcome: str) -> float:
        needle = f'sgl_omni_stage_jobs_total{{outcome="{outcome}",stage="{stage}"}} '
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(needle):
                return float(line[len(needle):])
        raise CheckFailed(f"/metrics has no {needle.strip()}")


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Server], str]


@dataclass(frozen=True)
class Section:
    """A server configuration (``serve_args`` after ``--model-path``) and its checks."""

    name: str
    serve_args: Callable[[argparse.Namespace], list[str]]
    checks: list[Check] = field(default_factory=list)


# --- helpers ----------------------------------------------------------------------------------
def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def chat(server: Server, body: dict, timeout: float = 600) -> dict:
    resp = httpx.post(f"{server.url}{CHAT}", json=body, timeout=timeout)
    expect(resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


def test_png() -> str:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (256, 256), (255, 255, 255))
    ImageDraw.Draw(image).rectangle((64, 64, 192, 192), fill=(220, 20, 20))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def data_events(lines: Iterator[str]) -> Iterator[dict | str]:
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


# --- reasoner checks --------------------------------------------------------------------------
def text_chat(server: Server) -> str:
    body = chat(server, {"messages": [{"role": "user", "content":
                                       "What is the capital city of France? One word."}],
                         "max_tokens": 32, "temperature": 0})
    text = body["choices"][0]["message"]["content"] or ""
    expect(bool(text.strip()), "empty answer")
    expect(body["usage"]["completion_tokens"] > 0, f"usage: {body['usage']}")
    return f"{text.strip()[:60]!r} ({body['usage']['completion_tokens']} tokens)"


def image_chat(server: Server) -> str:
    plain = chat(server, {"messages": [{"role": "user", "content": "Describe the image."}],
                          "max_tokens": 8})
    content = [{"type": "text", "text": "What color is the square? One word."},
               {"type": "image_url", "image_url": {"url": test_png()}}]
    body = chat(server, {"messages": [{"role": "user", "content": content}], "max_tokens": 32,
                         "temperature": 0})
    text = body["choices"][0]["message"]["content"] or ""
    expect(bool(text.strip()), "empty answer")
    extra = body["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    expect(extra > 16, f"the image added only {extra} prompt tokens")
    return f"{text.strip()[:60]!r} (+{extra} prompt tokens for the image)"


def streaming(server: Server) -> str:
    body = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Count from one to ten in words."}]}
    deltas, finish, usage, done = [], None, None, False
    with httpx.stream("POST", f"{server.url}{CHAT}", json=body, timeout=600) as resp:
        expect(resp.status_code == 200, f"HTTP {resp.status_code}")
        for event in data_events(resp.iter_lines()):
            if event == "[DONE]":
                done = True
                continue
            expect("error" not in event, f"stream error: {event}")
            choice = event["choices"][0]
            deltas.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
            usage = event.get("usage") or usage
    expect(done and finish is not None, f"finish {finish}, [DONE] {done}")
    expect(sum(1 for d in deltas if d) > 1, f"{len(deltas)} chunks: not streamed")
    return f"{sum(1 for d in deltas if d)} content chunks, finish {finish}, usage {usage}"


def abort_mid_stream(server: Server) -> str:
    before = server.metric("reasoner", "aborted")
    body = {"stream": True, "messages": [{"role": "user", "content": "Write a long story."}],
            **LONG}
    with httpx.stream("POST", f"{server.url}{CHAT}", json=body, timeout=600) as resp:
        expect(resp.status_code == 200, f"HTTP {resp.status_code}")
        events = data_events(resp.iter_lines())
        for _ in range(5):
            next(events)
        closed = time.monotonic()
    deadline = closed + 10
    while server.metric("reasoner", "aborted") < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    took = time.monotonic() - closed
    expect(server.metric("reasoner", "aborted") >= before + 1, "no abort within 10 s")
    start = time.monotonic()
    text_chat(server)  # the engine is free again
    return f"aborted {took:.2f} s after the close; next request {time.monotonic() - start:.2f} s"


def admission_503(server: Server) -> str:
    """Hold MAX_RUNNING + MAX_QUEUED long streams (the queued one gets no headers until native
    starts it, so they are held from threads), then expect 503 for one more."""
    body = {"stream": True, "messages": [{"role": "user", "content": "Write a long story."}],
            **LONG}
    before = server.metric("reasoner", "submitted")
    stop = threading.Event()
    clients = [httpx.Client(timeout=600) for _ in range(MAX_RUNNING + MAX_QUEUED)]

    def hold(client: httpx.Client) -> None:
        try:
            with client.stream("POST", f"{server.url}{CHAT}", json=body) as resp:
                for _ in resp.iter_lines():
                    if stop.is_set():
                        return
        except (httpx.HTTPError, RuntimeError, OSError):
            return  # closed by the check

    threads = [threading.Thread(target=hold, args=(c,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 120
        while server.metric("reasoner", "submitted") < before + len(clients):
            expect(time.monotonic() < deadline, "the held requests did not reach the stage")
            time.sleep(0.1)
        resp = httpx.post(f"{server.url}{CHAT}", timeout=60, json={
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}}]}]})
        expect(resp.status_code == 503, f"expected 503, got {resp.status_code}: {resp.text}")
    finally:
        stop.set()
        for client in clients:
            client.close()
        for thread in threads:
            thread.join(30)
    return f"503 beyond {MAX_RUNNING} running + {MAX_QUEUED} queued: {resp.json()['error']}"


SECTIONS = [
    Section(
        "reasoner",
        lambda args: ["--text-only", "--reasoner.gpu", str(args.reasoner_gpu),
                      "--reasoner.engine.max_running_requests", str(MAX_RUNNING),
                      "--reasoner.engine.max_queued_requests", str(MAX_QUEUED)],
        [Check("text chat", text_chat), Check("image chat", image_chat),
         Check("streaming", streaming), Check("abort mid-stream", abort_mid_stream),
         Check("503 beyond the admission sum", admission_503)],
    ),
]


# === generation section ========================================================================
# Direct generation (Cosmos3PipelineConfig) with the native backend on --generation-gpu: an
# image, a video saved through the SDK, an abort in the middle of a video, and last (it leaves
# the server unusable) a native generation worker killed during a video.
GENERATION_IMAGE = {"size": "640x640", "seed": 7}
GENERATION_VIDEO = {"size": "640x640", "seed": 7, "num_frames": 33, "fps": 24}
GENERATION_STEPS = 35  # native Cosmos3 default
_generation_facts: dict[str, float] = {}


def generation_serve_args(args: argparse.Namespace) -> list[str]:
    config = Path(tempfile.mkstemp(prefix="qualify-direct-", suffix=".yaml")[1])
    config.write_text("config_cls: Cosmos3PipelineConfig\n")
    return ["--config", str(config), "--generation.gpu", str(args.generation_gpu)]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise CheckFailed(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)
    return time.monotonic() - start


def video_job(server: Server, video_id: str) -> dict:
    return httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=30).json()


def generation_image(server: Server) -> str:
    from PIL import Image

    start = time.monotonic()
    resp = httpx.post(f"{server.url}/v1/images/generations", timeout=3600, json={
        "prompt": "A red cube on a wooden table, studio light.", **GENERATION_IMAGE})
    expect(resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:300]}")
    data = base64.b64decode(resp.json()["data"][0]["b64_json"])
    with Image.open(io.BytesIO(data)) as img:
        expect(img.format == "PNG" and img.size == (640, 640), f"{img.format} {img.size}")
    return f"640x640 PNG, {len(data)} bytes, {time.monotonic() - start:.1f} s"


def generation_video(server: Server) -> str:
    from sglang_omni.client import Client
    from sglang_omni.engines.synth_media import decode_mp4_frames

    start = time.monotonic()
    with tempfile.TemporaryDirectory() as folder, Client(server.url, timeout=3600) as client:
        files = client.generate_media("A blue ball rolling across a tiled floor.",
                                      kind="video", output_dir=folder, **GENERATION_VIDEO)
        frames = decode_mp4_frames(files[0].read_bytes())
    took = time.monotonic() - start
    _generation_facts["step_s"] = took / GENERATION_STEPS
    expect(len(frames) == 33 and frames[0].shape[:2] == (640, 640),
           f"{len(frames)} frames of {frames[0].shape}")
    held = httpx.get(f"{server.url}/v1/videos", timeout=30).json()["data"]
    expect(held == [], f"the server still holds {len(held)} video job(s)")
    return f"33 frames 640x640 saved by the SDK, {took:.1f} s, no copy left on the server"


def generation_abort_mid_video(server: Server) -> str:
    step_s = _generation_facts.get("step_s", 2.0)
    before = server.metric("generation", "aborted")
    job = httpx.post(f"{server.url}/v1/videos", timeout=60, json={
        "prompt": "A slow pan over a mountain lake at dawn.",
        "num_inference_steps": GENERATION_STEPS, **GENERATION_VIDEO}).json()
    wait_until(lambda: video_job(server, job["id"])["status"] == "in_progress", 600,
               "the video starting")
    time.sleep(max(0.5, 3 * step_s))  # a few steps into the denoising loop
    deleted_at = time.monotonic()
    deleted = httpx.delete(f"{server.url}/v1/videos/{job['id']}", timeout=60).json()
    expect(deleted["progress"] < 100, "the video finished before it could be aborted")
    wait_until(lambda: server.metric("generation", "aborted") > before, 300,
               "the stage reporting the abort")
    stopped = time.monotonic() - deleted_at
    limit = max(5.0, 3 * step_s)
    expect(stopped < limit, f"the aborted video stopped {stopped:.1f} s after DELETE (limit "
                            f"{limit:.1f} s; a step takes about {step_s:.1f} s)")
    generation_image(server)  # the stage is free again
    return f"stopped {stopped:.1f} s after DELETE (a step takes about {step_s:.1f} s)"


def generation_worker_kill(server: Server) -> str:
    import psutil

    stage = httpx.get(f"{server.url}/health", timeout=30).json()["stages"]["generation"]["pid"]
    workers = [p for p in psutil.Process(stage).children()
               if "spawn_main" in " ".join(p.cmdline())]
    expect(bool(workers), "no native generation worker under the generation stage")
    job = httpx.post(f"{server.url}/v1/videos", timeout=60, json={
        "prompt": "Waves breaking on rocks.", "num_inference_steps": GENERATION_STEPS,
        **GENERATION_VIDEO}).json()
    wait_until(lambda: video_job(server, job["id"])["status"] == "in_progress", 600,
               "the video starting")
    time.sleep(max(0.5, 3 * _generation_facts.get("step_s", 2.0)))
    workers[0].send_signal(signal.SIGKILL)
    state: dict = {}
    took = wait_until(lambda: state.update(video_job(server, job["id"])) or
                      state["status"] == "failed", 30, "the video job failing")
    message = state["error"]["message"]
    expect("native generation worker" in message, f"error: {message}")
    wait_until(lambda: httpx.get(f"{server.url}/health", timeout=30).status_code == 503, 30,
               "/health answering 503")
    return f"the job failed {took:.1f} s after the kill: {message[:120]}"


SECTIONS.append(Section(
    "generation", generation_serve_args,
    [Check("image", generation_image), Check("video", generation_video),
     Check("abort mid-video", generation_abort_mid_video),
     Check("worker kill (last: stops the stage)", generation_worker_kill)],
))
# === end of the generation section =============================================================


# --- running ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(model_path: str, args: list[str], startup_timeout: float) -> Iterator[Server]:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="qualify-native-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "sglang_omni", "serve", "--model-path", model_path,
           "--port", str(port), *args]
    print(f"starting: {' '.join(cmd)}\n  log: {log_path}", flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}:\n"
                                   f"{server.log_tail()}")
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {startup_timeout:g} s:\n{server.log_tail()}")
            time.sleep(1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True, help="the Cosmos3 Nano checkpoint")
    parser.add_argument("--reasoner-gpu", type=int, default=0)
    parser.add_argument("--generation-gpu", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=1800)
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra sgl-omni serve argument, after the section's own "
                             "(repeatable), e.g. --serve-arg=--reasoner.engine.context_length "
                             "--serve-arg=32768")
    parser.add_argument("--section", action="append", choices=[s.name for s in SECTIONS],
                        help="sections to run (default: all)")
    parser.add_argument("--only", action="append", help="run only checks whose name contains "
                                                       "this text (repeatable)")
    args = parser.parse_args(argv)
    rows: list[tuple[str, str, bool, float, str]] = []
    for section in SECTIONS:
        if args.section and section.name not in args.section:
            continue
        checks = [c for c in section.checks
                  if not args.only or any(o in c.name for o in args.only)]
        if not checks:
            continue
        try:
            serve_args = [*section.serve_args(args), *args.serve_arg]
            with serve(args.model_path, serve_args, args.startup_timeout) as srv:
                for check in checks:
                    start = time.monotonic()
                    try:
                        detail, ok = check.run(srv), True
                    except Exception as exc:  # noqa: BLE001 - every failure is reported
                        detail, ok = f"{type(exc).__name__}: {exc}", False
                    rows.append((section.name, check.name, ok, time.monotonic() - start,
                                 detail))
                    print(f"  {'PASS' if ok else 'FAIL'} {section.name} / {check.name}",
                          flush=True)
        except RuntimeError as exc:
            rows.extend((section.name, c.name, False, 0.0, f"server: {exc}") for c in checks)
    print_table(rows)
    return 0 if rows and all(ok for _, _, ok, _, _ in rows) else 1


def print_table(rows: list[tuple[str, str, bool, float, str]]) -> None:
    width = max([len(f"{s} / {c}") for s, c, *_ in rows] + [5])
    print(f"\n{'check':<{width}}  result  seconds  detail")
    for section, name, ok, seconds, detail in rows:
        line = detail.splitlines()[0] if detail else ""
        print(f"{section + ' / ' + name:<{width}}  {'PASS' if ok else 'FAIL':<6}  "
              f"{seconds:7.2f}  {line[:120]}")


if __name__ == "__main__":
    sys.exit(main())
