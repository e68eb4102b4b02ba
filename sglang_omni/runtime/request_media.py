"""The media a stage keeps for its running requests, so each item crosses the stage wire once.

A ``submit`` may carry ``media {keys, new}`` beside its payload: ``keys`` names, in order, the
media items the job reads (they become ``job.frames``, and the payload refers to item *i* as
``omni-frame://i``); ``new`` names the items whose bytes travel with this message, as its frames,
in the same order. The stage keeps every item under (request id, key) until the request ends
(``end``), is aborted (``abort``), or the process exits, so a later job of the request names
the items it already sent instead of sending them again. A job naming an item the stage does
not hold (the stage process restarted since the item was sent) fails with :class:`StageDied`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from sglang_omni.contract.result import Frames
from sglang_omni.errors import ServerError, StageDied


class RequestMediaStore:
    """Media items by request id and key; thread-safe (the stats are read by another thread)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, bytes | bytearray]] = {}
        self._bytes = 0
        #: Items and bytes received since the process started (each once per request).
        self._received_items = 0
        self._received_bytes = 0

    def frames_for(self, rid: str, media: Any, frames: Frames) -> Frames:
        """Keep the message's ``frames`` under ``media["new"]`` for ``rid`` and return the
        job's frames, ``media["keys"]`` in order. StageDied when a key names an item this
        process does not hold; ServerError when ``media`` is malformed (a server bug)."""
        keys, new = _keys(media, "keys"), _keys(media, "new")
        if len(new) != len(frames):
            raise ServerError(f"request {rid}: {len(frames)} media frame(s) arrived for "
                              f"{len(new)} new item(s); report this server bug")
        with self._lock:
            held = self._items.setdefault(rid, {})
            for key, frame in zip(new, frames, strict=True):
                self._bytes += len(frame) - len(held.get(key, b""))
                held[key] = frame
                self._received_items += 1
                self._received_bytes += len(frame)
            missing = [key for key in keys if key not in held]
            if not missing:
                return [held[key] for key in keys]
        raise StageDied(
            f"the {self.stage} stage no longer holds {len(missing)} media item(s) of request "
            f"{rid} (its process restarted after they were sent, losing them); retry the "
            "request")

    def release(self, rid: str) -> None:
        """Drop everything kept for ``rid`` (nothing when it holds nothing)."""
        with self._lock:
            held = self._items.pop(rid, None)
            if held:
                self._bytes -= sum(len(frame) for frame in held.values())

    def stats(self) -> dict[str, int]:
        """``requests``, ``items`` and ``bytes`` held now; ``received_items`` and
        ``received_bytes`` since the process started."""
        with self._lock:
            return {"requests": len(self._items),
                    "items": sum(len(held) for held in self._items.values()),
                    "bytes": self._bytes, "received_items": self._received_items,
                    "received_bytes": self._received_bytes}


def _keys(media: Any, name: str) -> list[str]:
    value = media.get(name) if isinstance(media, Mapping) else None
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise ServerError(f"a submit's media.{name} is not a list of keys; report this server "
                          "bug")
    return value
