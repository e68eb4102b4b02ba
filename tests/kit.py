"""Helpers shared by the test packages: stage job counters from ``/metrics``, the JSON error
shape, SSE parsing, scripted prompts, PNG sizes and polling. Package kits re-export what their
tests use."""

from __future__ import annotations

import io
import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
from PIL import Image

from tests.server import Server

# One client (building one costs about 80 ms, its SSL context); no keep-alive, so a server
# that closes idle connections (the wire tests' one-second idle timeout) cannot race a reuse.
_METRICS = httpx.Client(timeout=5, limits=httpx.Limits(max_keepalive_connections=0))
JOBS_RE = re.compile(r'^sgl_omni_stage_jobs_total\{outcome="([^"]+)",stage="([^"]+)"\} (\S+)$')

#: A stage process's own temporary folder (``StageHandle``: ``sgl-omni-<stage>-<random>``),
#: there while the stage runs.
STAGE_SCRATCH = re.compile(r"^(sgl-omni-[a-z_]+)-[a-z0-9_]{8}(?=/|$)")


# --- metrics ------------------------------------------------------------------------------------
def job_counts(server: Server) -> dict[tuple[str, str], float]:
    """Every ``sgl_omni_stage_jobs_total`` counter of ``/metrics``, by (stage, outcome); empty
    before any stage got a job."""
    out = {}
    for line in _METRICS.get(f"{server.url}/metrics").text.splitlines():
        match = JOBS_RE.match(line)
        if match:
            out[match[2], match[1]] = float(match[3])
    return out


def request_states(server: Server) -> float:
    """``sgl_omni_request_states``: the request states live in the server's orchestrator."""
    for line in _METRICS.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("sgl_omni_request_states "):
            return float(line.split()[1])
    raise AssertionError("no sgl_omni_request_states gauge in /metrics")


def no_request_states(server: Server, timeout: float = 10.0) -> str | None:
    """None once the server holds no request state (each is released when its response
    ended, a moment after the client read it), else what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (live := request_states(server)) != 0:
        if time.monotonic() > deadline:
            return f"{live:g} request state(s) still live {timeout:g} s after every request ended"
        time.sleep(0.05)
    return None


def metric(server: Server, stage: str, outcome: str, default: float | None = None) -> float:
    """The ``sgl_omni_stage_jobs_total`` counter of ``stage``/``outcome``; ``default`` when
    ``/metrics`` has none (AssertionError when ``default`` is None)."""
    value = job_counts(server).get((stage, outcome), default)
    if value is None:
        raise AssertionError(f"no {stage}/{outcome} job counter in /metrics")
    return value


# --- answers ------------------------------------------------------------------------------------
def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of a JSON error answer (asserting the documented shape)."""
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:200]
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "code"}, error
    assert error["code"] == resp.status_code
    return error


def error_message(resp: httpx.Response) -> str:
    """The message of a JSON error answer (asserting the documented shape)."""
    return str(error_of(resp)["message"])


def parse_sse(raw: str) -> list[tuple[str, Any]]:
    """(event, data) pairs, splitting only at CR/LF as the SSE format does; data is decoded JSON,
    or the string ``[DONE]``; comments are skipped."""
    out = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if not data:  # a comment-only block (": keep-alive")
            continue
        text = "\n".join(data)
        out.append((event, text if text == "[DONE]" else json.loads(text)))
    return out


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of PNG bytes (asserting the format)."""
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        return img.size


# --- prompts ------------------------------------------------------------------------------------
def script(*entries: object, tail: str = " go") -> str:
    """A prompt holding ``<omni-script>`` for the scripted Reasoner, then ``tail``."""
    return f"<omni-script>{json.dumps(list(entries))}</omni-script>{tail}"


# --- clients that leave ------------------------------------------------------------------------
def leave_when(server: Server, path: str, body: dict[str, Any], ready: Callable[[], bool],
               timeout: float = 30) -> None:
    """POST ``body`` (JSON) to ``path`` on a connection of its own and close it, as a client
    that gives up, once ``ready()`` holds (say, its job counted as submitted): a client's read
    timeout, without a clock deciding whether the request had got that far."""
    raw = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        wait_for(ready, timeout)


# --- polling ------------------------------------------------------------------------------------
def wait_for(condition: Callable[[], bool], timeout: float = 10.0, poll: float = 0.05) -> float:
    """Seconds until ``condition()`` held; AssertionError after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(poll)
    return time.monotonic() - start


def wait_until(condition: Callable[[], bool], timeout: float = 10, poll: float = 0.05) -> bool:
    """Whether ``condition()`` held within ``timeout`` seconds (checked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


#: The stage's log lines that say where an aborted generation stopped: the scripted engine's,
#: and the stage's own for a job its engine never began (the abort came with the submit, or
#: while the job waited for the GPU): that one stopped at step 0.
_STOPPED_AT = re.compile(r"request (\S+): generation cancelled at step (\d+) of \d+"
                         r"|request (\S+) aborted before its engine began it")


def generation_stops(log: str) -> list[tuple[str, int]]:
    """(rid, step) for each aborted generation in a server's ``log``, in log order."""
    return [(m[1], int(m[2])) if m[1] else (m[3], 0) for m in _STOPPED_AT.finditer(log)]
