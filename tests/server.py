"""Start real ``sgl-omni serve`` processes for tests and take them down afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

SCRIPTED_UMM = ["--config", str(Path(__file__).parent.parent / "configs" / "cpu-scripted.yaml")]
SCRIPTED_CHAT = ["--text-only", "--reasoner.gpu", "null", "--reasoner.factory.backend",
                 "scripted"]
SCRIPTED_GENERATION = ["--config", str(Path(__file__).parent / "direct-scripted.yaml")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on a free port; ``log()`` returns what it printed so far."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 wait_ready: bool = True, timeout: float = 60) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="sgl-omni-test-", suffix=".log",
                                                delete=False)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
        )
        if wait_ready:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stage_pid(self, name: str) -> int:
        return httpx.get(f"{self.url}/health", timeout=5).json()["stages"][name]["pid"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(5)
        self._log.close()
        os.unlink(self._log.name)
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
