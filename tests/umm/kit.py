"""Helpers for the interleaved (UMM) tests: scripts, metrics, SSE parsing, data URLs."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.kit import job_counts
from tests.kit import metric as metric  # shared helpers, re-exported for the umm tests
from tests.kit import parse_sse as parse_sse
from tests.kit import png_size as png_size
from tests.kit import script as script
from tests.kit import wait_for as wait_for
from tests.server import SCRIPTED_UMM, Server

# Widths of 128 give reproducible MP4 bytes from the scripted generator (smaller frames do not:
# see the report on synth_media.encode_mp4), so tests comparing bytes across requests use it.
STABLE = {"width": 128, "height": 96}
SMALL = {"width": 32, "height": 32, "num_frames": 3}


def image(prompt: str, **extra: object) -> dict[str, Any]:
    return {"action": "image", "prompt": prompt, **extra}


def video(prompt: str, **extra: object) -> dict[str, Any]:
    return {"action": "video", "prompt": prompt, **extra}


def final(text: str, **extra: object) -> dict[str, Any]:
    return {"action": "final", "text": text, **extra}


# One client for the whole run: building an httpx client costs about 80 ms (its SSL context).
HTTP = httpx.Client(timeout=60)


def counts(server: Server) -> dict[tuple[str, str], float]:
    """Every stage job counter of ``/metrics``, by (stage, outcome); asserts there is one."""
    out = job_counts(server)
    assert out, "no sgl_omni_stage_jobs_total in /metrics"
    return out


@contextmanager
def umm_server(*flags: str) -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *flags) as server:
        yield server


# --- requests -------------------------------------------------------------------------------------
def stream_generate(server: Server, body: dict[str, Any],
                    timeout: float = 60) -> tuple[int, list[tuple[str, Any]]]:
    with HTTP.stream("POST", f"{server.url}/generate", json={**body, "stream": True},
                     timeout=timeout) as resp:
        raw = resp.read().decode()
    return resp.status_code, parse_sse(raw) if resp.status_code == 200 else json.loads(raw)


def post_generate(server: Server, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return HTTP.post(f"{server.url}/generate", json=body, timeout=timeout)


def post_chat(server: Server, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return HTTP.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout)


def segments_of(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [data for event, data in events if event == "segment"]


def only(events: list[tuple[str, Any]], name: str) -> Any:
    found = [data for event, data in events if event == name]
    assert len(found) == 1, events
    return found[0]


# --- media --------------------------------------------------------------------------------------
def decode_data_url(url: str) -> tuple[str, bytes]:
    head, _, payload = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), head
    return head[5:-7], base64.b64decode(payload)


def media_bytes(segment: dict[str, Any]) -> bytes:
    mime, data = decode_data_url(segment["data"]["url"])
    assert mime == segment["data"]["mime_type"]
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def png_data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def without_execution_id(segment: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in segment.items() if k != "execution_id"}


def reference(segment: dict[str, Any]) -> dict[str, Any]:
    """A segment as ``event: complete`` lists it: a reference without data."""
    return {k: v for k, v in segment.items() if k != "data"}
