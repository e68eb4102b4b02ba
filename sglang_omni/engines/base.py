"""The engine interface every backend implements, inside a stage process.

A stage process holds one engine and no request state. For each request it builds a ``Job`` and
awaits ``engine.run(job)``. An abort sets ``job.cancelled`` and cancels the task running the job,
so an engine stops either at its next ``await`` or, for blocking compute in a thread, at its
next check of ``job.cancelled``.

Payloads by role:

* reasoner: ``{"messages": [...], "sampling": {...}, "response_format": {...} | None,
  "stream": bool, "turn_index": int, "umm_adapter": "module:Class" | None}``. Inline media in
  messages are content parts whose url is ``omni-frame://N``: the bytes are ``job.frames[N]``.
  Result payload: ``{"text", "finish_reason", "usage"}``; streamed chunks ``{"text": delta}``.
* generation: ``{"modality": "image" | "video", "prompt": str, "options": {...}}``. Result
  payload: ``{"media": [{"kind", "mime_type", "frame"}], "reason": str | None}`` with the bytes
  in ``JobResult.frames``; ``media`` is empty when the model produced nothing (``reason`` says
  why). Chunks: ``{"step": i, "steps": n}`` progress.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

FRAME_SCHEME = "omni-frame://"


@dataclass
class Job:
    """One request as an engine sees it. ``emit`` is thread-safe and keeps chunk order."""

    rid: str
    payload: dict[str, Any]
    frames: list[bytes]
    emit: Callable[[dict[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def frame_for(self, url: str) -> bytes | None:
        """The inline bytes an ``omni-frame://N`` url names, or None for other urls."""
        if not url.startswith(FRAME_SCHEME):
            return None
        return self.frames[int(url[len(FRAME_SCHEME):])]


@dataclass
class JobResult:
    payload: dict[str, Any]
    frames: list[bytes] = field(default_factory=list)


class Engine(Protocol):
    """A backend. ``start`` loads the model (before the ready handshake); ``close`` frees it."""

    async def start(self) -> None: ...

    async def run(self, job: Job) -> JobResult: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """What a stage process needs to build its engine (picklable for spawn)."""

    stage: str
    role: str
    backend: str
    model_path: str | None
    gpu: int | None
    gpu_memory_fraction: float | None
    factory: dict[str, Any]
    engine: dict[str, Any]
    media_policy: dict[str, Any] = field(default_factory=dict)


def build_engine(spec: EngineSpec) -> Engine:
    """Construct the backend ``spec`` names; imports heavy libraries only for that backend."""
    if spec.backend == "scripted":
        from sglang_omni.engines import scripted

        if spec.role == "reasoner":
            return scripted.ScriptedReasoner(spec)
        return scripted.ScriptedGenerator(spec)
    if spec.backend == "native":
        raise RuntimeError(
            f"stages.{spec.stage}.factory.backend: the native backend is not available in this "
            "build yet; use backend scripted"
        )
    raise RuntimeError(
        f"stages.{spec.stage}.factory.backend: {spec.backend!r} is not available in this build; "
        "use backend scripted"
    )
