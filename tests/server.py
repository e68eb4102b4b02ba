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

from sglang_omni.runtime.proc import kill_led_group

SCRIPTED_UMM = ["--config", str(Path(__file__).parent.parent / "configs" / "cpu-scripted.yaml")]
SCRIPTED_CHAT = ["--text-only", "--reasoner.gpu", "null", "--reasoner.factory.backend",
                 "scripted"]
SCRIPTED_GENERATION = ["--config", str(Path(__file__).parent / "direct-scripted.yaml")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The node id of the running test when it has no ``server`` marker (set by tests/conftest.py):
#: such a test may not start a server, or ``pytest -m "not server"`` would run it.
unmarked_test: str | None = None
#: Servers started at once (parallel test workers, other test runs) can pick the same free port
#: before either binds it; the one that loses exits naming the address, and starts again.
PORT_ATTEMPTS = 3


def kill_own_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal ``proc`` (started with ``start_new_session``) and what is left of its group, never
    a later process given its pid (see :func:`~sglang_omni.runtime.proc.kill_led_group`)."""
    kill_led_group(proc.pid, proc.returncode is not None, sig)


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after ``free_port()``."""


class Server:
    """A server subprocess on a free port; ``log()`` returns what it printed so far."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 wait_ready: bool = True, timeout: float = 60) -> None:
        if unmarked_test is not None:
            raise RuntimeError(f"{unmarked_test} starts a server without the 'server' marker: "
                               "tests/markers.py missed it; mark it @pytest.mark.server")
        self._args = args
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._start()
            if not wait_ready:
                return
            try:
                self.wait_ready(timeout)
                return
            except RuntimeError as exc:
                self.stop()  # the error holds the log
                if not isinstance(exc, PortTaken) or attempt == PORT_ATTEMPTS:
                    raise

    def _start(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="sgl-omni-test-", suffix=".log",
                                                delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", "--port", str(self.port),
             *self._args],
            stdout=self._log, stderr=subprocess.STDOUT, env=self._env, start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        """Until ``/health`` answers 200 from this server's own listening socket; PortTaken
        when the server exited because its port was taken, RuntimeError for other exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                if "address already in use" in log.lower():
                    raise PortTaken(f"port {self.port} taken:\n{log}")
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200 \
                        and self._listens():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout} s:\n{self.log()}")

    def _listens(self) -> bool:
        """Whether this server process holds the listening socket of its port (not a server
        of another test that took the port first)."""
        try:
            conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns)

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
        kill_own_group(self.proc)
        self.proc.wait(5)
        self._log.close()
        os.unlink(self._log.name)
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
