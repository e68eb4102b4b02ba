"""What ``serve_gpu.py`` needs around a running server: its log followed line by line, GPU
memory sampled with nvidia-smi, CPU time per process, the server process itself, and a
streaming HTTP client that can disconnect on a condition."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[([^\]]+)\] (.*)$")


class LogTail:
    """Follows the server's log file; keeps (wall time, source, message) per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str, str]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        with open(self.path, errors="replace") as f:
            buf = ""
            while not self.stop.is_set():
                chunk = f.readline()
                if not chunk:
                    time.sleep(0.02)
                    continue
                buf += chunk
                if not buf.endswith("\n"):
                    continue
                line, buf = buf.rstrip("\n"), ""
                m = STAMP.match(line)
                if m:
                    at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    with self.lock:
                        self.lines.append((at, m.group(2), m.group(3)))

    def since(self, index: int) -> list[tuple[float, str, str]]:
        with self.lock:
            return self.lines[index:]

    def mark(self) -> int:
        with self.lock:
            return len(self.lines)

    def wait(self, pattern: re.Pattern[str], start: int, timeout: float,
             rid: str | None = None) -> tuple[float, re.Match[str]] | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for at, _, message in self.since(start):
                m = pattern.search(message)
                if m and (rid is None or rid in message):
                    return at, m
            time.sleep(0.05)
        return None


class GpuSampler:
    """Peak GPU memory per process and per GPU, from nvidia-smi every half second."""

    def __init__(self) -> None:
        self.per_pid: dict[int, int] = {}
        self.per_gpu: dict[int, int] = {}
        self.stop = threading.Event()
        import shutil

        self.available = shutil.which("nvidia-smi") is not None
        if self.available:
            threading.Thread(target=self._run, daemon=True).start()

    def _query(self, what: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for pid, used in self._query("compute-apps=pid,used_memory"):
                    self.per_pid[int(pid)] = max(self.per_pid.get(int(pid), 0), int(used))
                for index, used in self._query("gpu=index,memory.used"):
                    self.per_gpu[int(index)] = max(self.per_gpu.get(int(index), 0), int(used))
            except (ValueError, subprocess.SubprocessError, OSError):
                pass
            time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, config: Path, log_path: Path, env: dict[str, str],
                 cwd: Path = REPO, args: tuple[str, ...] = ()) -> None:
        """``cwd``: the checkout whose ``sglang_omni`` serves (``python -m`` imports from it);
        ``args``: more ``sgl-omni serve`` flags."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", "--config", str(config), "--host",
             "127.0.0.1", "--port", str(self.port), "--log-level", "info", *args],
            stdout=self.log_file, stderr=subprocess.STDOUT, env=env, cwd=str(cwd))

    def wait_ready(self, timeout: float) -> float:
        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.time() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("the server did not become ready in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


class CpuClock:
    """CPU seconds (user + system) of the server's processes, split into Omni and stages."""

    def __init__(self, server_pid: int, stage_pids: dict[str, int]) -> None:
        self.server_pid = server_pid
        self.stage_pids = stage_pids

    def read(self) -> dict[str, float]:
        import psutil

        totals: dict[str, float] = {"omni": 0.0, **{s: 0.0 for s in self.stage_pids}}
        owner = {pid: stage for stage, pid in self.stage_pids.items()}
        try:
            root = psutil.Process(self.server_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return totals
        for proc in procs:
            try:
                times = proc.cpu_times()
                stage = owner.get(proc.pid)
                if stage is None:
                    parents = {p.pid for p in proc.parents()}
                    stage = next((s for pid, s in owner.items() if pid in parents), "omni")
                totals[stage] += times.user + times.system
            except psutil.Error:
                continue
        return totals


def http_client() -> Any:
    """The client ``sse_request`` uses: long reads, a 10 s connect."""
    import httpx

    return httpx.Client(timeout=httpx.Timeout(3600.0, connect=10.0))


def sse_request(url: str, body: dict[str, Any], stop_when: Any = None,
                client: Any = None) -> dict[str, Any]:
    """POST a streaming request and read its SSE items (kinds and times, not the data).

    ``stop_when(events)`` is polled every 20 ms from another thread; when it returns True the
    client disconnects (the socket is shut down) and ``disconnected_at`` records when.
    ``client``: an ``http_client()`` made beforehand (its set-up then falls before ``started``,
    so requests sent in a row arrive in that order); else one is made and closed here."""
    import contextlib
    import socket as sockets

    import httpx

    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(http_client())
        return _sse(client, url, body, stop_when, sockets, httpx)
    raise AssertionError("unreachable")


def _sse(client: Any, url: str, body: dict[str, Any], stop_when: Any, sockets: Any,
         httpx: Any) -> dict[str, Any]:
    started = time.time()
    events: list[dict[str, Any]] = []
    out: dict[str, Any] = {"events": events, "disconnected_at": None, "started": started}
    done = threading.Event()
    with client.stream("POST", url, json=body) as response:
        out["status"] = response.status_code
        if response.status_code != 200:  # an error answer, not a stream: keep its message
            try:
                out["error_body"] = json.loads(response.read())
            except ValueError:
                out["error_body"] = response.text[:2000]
        sock = response.extensions["network_stream"].get_extra_info("socket")

        def watchdog() -> None:
            while not done.is_set():
                if stop_when is not None and stop_when(events):
                    out["disconnected_at"] = time.time()
                    try:
                        sock.shutdown(sockets.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                time.sleep(0.02)

        threading.Thread(target=watchdog, daemon=True).start()
        event = "message"
        try:
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                item: dict[str, Any] = {"event": event, "t": round(time.time() - started, 4)}
                if data != "[DONE]":
                    item.update(_summary(event, json.loads(data)))
                events.append(item)
                event = "message"
        except (httpx.HTTPError, OSError):
            if out["disconnected_at"] is None:
                raise
        finally:
            done.set()
    out["wall_s"] = round(time.time() - started, 4)
    return out


def _summary(event: str, data: dict[str, Any]) -> dict[str, Any]:
    """The kind of an SSE item (and a media segment's size), without its data."""
    if event == "segment":
        seg = data.get("data") if isinstance(data.get("data"), dict) else {}
        return {"kind": data.get("kind"), "bytes": seg.get("size_bytes")}
    if event == "complete":
        return {"finish_reason": data.get("finish_reason"), "usage": data.get("usage")}
    if event == "error":
        return {"error": data.get("message", data)}
    choices = data.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    seg = delta.get("segment")
    return {"kind": (seg or {}).get("kind") or ("text" if delta.get("content") else None),
            "finish_reason": choices[0].get("finish_reason")}
