"""Helpers for the reliability suite: servers in private temp folders, the documented answer
statuses, the JSON error shape, SSE reading, and process/fd/temp-file accounting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from sglang_omni.engines.native.lifecycle import running
from tests.kit import STAGE_SCRATCH, parse_sse
from tests.kit import script as script  # shared; re-exported for the reliability tests
from tests.server import Server

#: Every status a client may see (500 only in the JSON error shape).
DOCUMENTED = {200, 400, 401, 404, 405, 408, 413, 415, 499, 500, 503}
#: Generous server options for the concurrency and resource tests: no admission refusals
#: (max_active above any client count used) and no deadline refusals. The plan is worst-case:
#: every active request (aborted ones until the stage says their jobs ended) is planned 8
#: generations at the longest generation and Reasoner turn measured within timeout_s. A full
#: run beside two CPU burners measured about 5 s for a 1-step generation with its turn, and 80
#: active requests then filled a 3600 s plan (4 of 1,000 aborted streams refused); a day
#: leaves 128 requests room for 84 s a generation.
ROOMY = ("--orchestrator.factory.max_active", "128", "--orchestrator.factory.timeout_s", "86400")
SMALL = {"width": 32, "height": 32, "num_frames": 3}
#: ``server.max_body_bytes`` of the shared direct generation server.
BODY_LIMIT = 2**20
#: Seconds a stage process may take to exit after the server process did.
ORPHAN_GRACE_S = 3.0


def error_shape_problem(body: Any) -> str | None:
    """None if ``body`` is ``{"error": {"message": str, "type": str, "code": int}}``."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return f"not the JSON error shape: {str(body)[:200]!r}"
    error = body["error"]
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str) \
            or not isinstance(error.get("code"), int) or isinstance(error.get("code"), bool):
        return f"error fields have wrong types: {str(error)[:200]!r}"
    return None


def answer_problem(status: int, raw: bytes, content_type: str = "application/json"
                   ) -> str | None:
    """What is wrong with one HTTP answer (None if well-formed): a status outside
    :data:`DOCUMENTED`, an error body not in the JSON shape, a 200 declared JSON that is not, or
    a 200 stream that does not end with ``[DONE]`` or carries a malformed error."""
    stream = content_type.startswith("text/event-stream")
    text = raw.decode(errors="replace")
    if status not in DOCUMENTED:
        return f"undocumented status {status}: {text[:200]!r}"
    if status == 499:
        return None
    if status != 200:
        try:
            body = json.loads(raw)
        except ValueError:
            return f"{status} with a body that is not JSON: {text[:200]!r}"
        problem = error_shape_problem(body)
        if problem is None and body["error"]["code"] != status:
            problem = f"error code {body['error']['code']} differs from status {status}"
        return None if problem is None else f"{status}: {problem}"
    if stream:
        try:
            events = parse_sse(text)
        except ValueError as exc:
            return f"200 stream with undecodable data ({exc}): {text[-300:]!r}"
        if not events or events[-1][1] != "[DONE]":
            return f"200 stream not ended by [DONE]: {text[-300:]!r}"
        for event, data in events[:-1]:
            if event == "error" and error_shape_problem({"error": data}) is not None:
                return f"malformed error event: {data!r}"
            if isinstance(data, dict) and "error" in data \
                    and error_shape_problem(data) is not None:
                return f"malformed error chunk: {data!r}"
        return None
    if "json" not in content_type:
        return None
    try:
        json.loads(raw)
    except ValueError:
        return f"200 with a body that is not JSON: {text[:200]!r}"
    return None


def healthy(server: Server) -> bool:
    try:
        resp = httpx.get(f"{server.url}/health", timeout=5)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200 and resp.json().get("status") == "ok"


# --- servers with their own temp folder -----------------------------------------------------
class TrackedServer:
    """A :class:`Server` whose processes use a private ``TMPDIR`` (so its temp files can be
    counted) and whose descendants are remembered (so orphans can be found after stop)."""

    def __init__(self, *args: str, timeout: float = 60) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="omni-reliability-"))
        #: processes, not pids: psutil checks a process's start time before it is signalled or
        #: counted, so a pid the kernel gave to another process since (pids wrap at 32768 here)
        #: is neither.
        self.seen: set[psutil.Process] = set()
        self.server = Server(*args, env={"TMPDIR": str(self.tmp)}, timeout=timeout)
        self.remember()

    @property
    def url(self) -> str:
        return self.server.url

    def remember(self) -> set[int]:
        """Record the server's current descendants; returns their pids."""
        found = set(self.server.descendants())
        self.seen |= found
        return {p.pid for p in found}

    def processes(self) -> list[psutil.Process]:
        """The server process and its descendants."""
        try:
            root = psutil.Process(self.server.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def temp_files(self, sockets: bool = False) -> list[str]:
        """Every path under the server's temp folder (Unix sockets, its IPC, only if
        ``sockets``), sorted, duplicates kept. A stage process's own temporary folder is named
        ``sgl-omni-<stage>-*`` whichever process of the stage holds it (a restarted stage
        has a new one), so one left behind by a dead process shows as a second entry."""
        out = []
        for root, dirs, files in os.walk(self.tmp):
            for name in dirs + files:
                path = os.path.join(root, name)
                if sockets or not Path(path).is_socket():
                    out.append(STAGE_SCRATCH.sub(r"\1-*", os.path.relpath(path, self.tmp)))
        return sorted(out)

    def graceful_stop(self, timeout: float = 20) -> list[int]:
        """SIGTERM the server, wait for it; the pids of every remembered descendant still alive
        :data:`ORPHAN_GRACE_S` afterwards (orphans), before anything is force-killed."""
        self.remember()
        proc = self.server.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except Exception:  # noqa: BLE001 - reported as a leftover below
                pass
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while True:
            alive = [p.pid for p in self.seen if running(p)]
            if not alive or time.monotonic() > deadline:
                return sorted(alive)
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.seen:  # a SIGSTOPped stage cannot see SIGTERM
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        self.server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextmanager
def tracked_server(*args: str) -> Iterator[TrackedServer]:
    srv = TrackedServer(*args)
    try:
        yield srv
    finally:
        srv.close()


def fds_and_rss(srv: TrackedServer) -> tuple[int, int]:
    """(open fds of the server and its stages, server RSS in bytes)."""
    fds = 0
    rss = 0
    for i, p in enumerate(srv.processes()):
        try:
            fds += p.num_fds()
            if i == 0:
                rss = p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return fds, rss
