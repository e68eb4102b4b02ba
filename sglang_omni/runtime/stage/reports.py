"""What a stage's heartbeat answers (``pong``) report, kept across its processes.

A ``pong`` carries the stage's media counters (``media``), its engine's own counters
(``engine``), what it keeps of its requests' media (``request_media``) and its device memory
(``gpu``); see :mod:`sglang_omni.runtime.stage.process`. :meth:`StageReports.pong` takes one
(ignoring what is malformed) and says whether the media counters moved (media arriving for a
stage's jobs is a sign of progress). :meth:`StageReports.new_process` is called when a process
of the stage starts: the counters of the process before are added to those kept so far, and what
described the running process (gauges, held media, device memory) is cleared.
"""

from __future__ import annotations

from typing import Any

from sglang_omni.contract.messages import Pong

#: Engine stats (``pong.engine``) that describe the running process, not counts since it began.
#: (``paused``, ``paused_bytes``: a generation stage's paused jobs, ``contract.gpu_turns``.)
ENGINE_GAUGES = frozenset({"bytes", "budget", "requests", "paused", "paused_bytes"})


def _ints(value: dict[Any, Any], floats: bool = False) -> dict[str, int]:
    kinds = (int, float) if floats else (int,)
    return {str(k): int(v) for k, v in value.items()
            if isinstance(v, kinds) and not isinstance(v, bool)}


class StageReports:
    """The counters a stage's processes reported."""

    def __init__(self) -> None:
        #: The media counters of the running process, and those of the earlier ones.
        self.media: dict[str, Any] = {}
        self._media_before: list[dict[str, Any]] = []
        #: The engine's counters of the running process, and the earlier ones' summed.
        self.engine: dict[str, int] = {}
        self._engine_before: dict[str, int] = {}
        #: The device memory counters (``allocated``, ``reserved``, ``peak`` bytes) the stage
        #: sent with its last heartbeat answer; None for a stage that does not use CUDA itself.
        self.gpu_memory: dict[str, int] | None = None
        #: What the running process keeps of its requests' media, from its last heartbeat
        #: answer (``runtime.request_media``; empty until the first, and after it exits).
        self.request_media: dict[str, int] = {}

    def pong(self, pong: Pong) -> bool:
        """Take a heartbeat answer; True when its media counters moved since the last."""
        moved = pong.media != self.media
        self.media = pong.media
        self.gpu_memory = _ints(pong.gpu) if pong.gpu is not None else None
        self.request_media = _ints(pong.request_media)
        if pong.engine is not None:
            self.engine = _ints(pong.engine, floats=True)
        return moved

    def new_process(self) -> None:
        """A new process of the stage starts: keep the counts of the last one."""
        if self.media:
            self._media_before.append(self.media)
            self.media = {}
        for key, value in self.engine.items():
            if key not in ENGINE_GAUGES:
                self._engine_before[key] = self._engine_before.get(key, 0) + value
        self.engine = {}
        self.gpu_memory = None
        self.request_media = {}

    def engine_stats(self) -> dict[str, int]:
        """The engine's counters: the gauges :data:`ENGINE_GAUGES` of the running process, every
        other value summed over every process this stage ran."""
        out = dict(self.engine)
        for key, value in self._engine_before.items():
            out[key] = out.get(key, 0) + value
        return out

    def media_stats(self) -> list[dict[str, Any]]:
        """The media counters of every process this stage ran (``MediaStats.snapshot``s)."""
        return [*self._media_before, self.media]
