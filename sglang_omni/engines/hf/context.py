"""The hf Reasoner's per-request context: what earlier turns of a request already computed.

An interleaved request sends its whole conversation on every Reasoner turn, every media item
included. The stage keeps, per request id:

- for each media item, by the sha256 of its bytes: what the processor made of it (grids and video
  metadata) and what the vision tower made of it (embeddings and deepstack features), so a later
  turn neither decodes, preprocesses nor encodes it again;
- the K/V cache of the request's last turn (its prompt and the tokens it generated) with those
  tokens and the token spans of its media, so the next turn prefills only what its prompt adds
  beyond the longest prefix it shares with them.

A context lives until the request ends (the server's ``end`` message), is aborted, or the stage
restarts (it is process memory). All contexts together stay within ``budget_bytes``: keeping an
entry evicts the least recently used ones (of any request) until the total fits, and an entry
larger than the budget is not kept. :meth:`ContextStore.stats` is what the stage reports.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

#: ``stages.<reasoner>.engine.context_budget_bytes`` when unset: 4 GiB.
DEFAULT_BUDGET_BYTES = 4 * 2**30


def tensor_bytes(*tensors: Any) -> int:
    """Bytes the given tensors (None skipped) hold."""
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors if t is not None)


@dataclass
class MediaFeatures:
    """One media item as the model reads it: ``kind`` is ``image`` or ``video``; ``processed``
    the processor's output for it without pixels (``image_grid_thw``, or ``video_grid_thw`` and
    ``video_metadata``); ``embeds`` the vision tower's output and ``deepstack`` its features per
    deepstack layer, on the model's device."""

    kind: str
    processed: dict[str, Any]
    embeds: Any
    deepstack: list[Any]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.embeds, *self.deepstack)


@dataclass
class TurnKV:
    """The K/V of ``ids`` (a transformers ``DynamicCache`` holding exactly ``len(ids)``
    positions) and the token spans ``(start, end, sha256)`` of the media among them."""

    ids: list[int]
    media: list[tuple[int, int, str]]
    cache: Any

    @property
    def nbytes(self) -> int:
        return sum(tensor_bytes(layer.keys, layer.values) for layer in self.cache.layers)


@dataclass
class _Stats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0


class ContextStore:
    """Contexts of the running requests, least recently used first; thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = int(budget_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._stats = _Stats()

    # --- media -------------------------------------------------------------------------------
    def media(self, rid: str, digest: str) -> MediaFeatures | None:
        """The kept features of ``rid``'s media item ``digest`` (counted as a hit or a miss)."""
        with self._lock:
            entry = self._entries.get((rid, "media:" + digest))
            if entry is None:
                self._stats.misses += 1
                return None
            self._stats.hits += 1
            self._entries.move_to_end((rid, "media:" + digest))
            features: MediaFeatures = entry[0]
            return features

    def keep_media(self, rid: str, digest: str, features: MediaFeatures,
                   cancelled: threading.Event | None = None) -> None:
        """Keep ``features`` for ``rid`` unless ``cancelled`` is set (see :meth:`keep_kv`)."""
        self._keep((rid, "media:" + digest), features, features.nbytes, cancelled)

    # --- K/V ---------------------------------------------------------------------------------
    def take_kv(self, rid: str) -> TurnKV | None:
        """Remove and return ``rid``'s K/V (the turn extends it in place, then keeps it)."""
        with self._lock:
            entry = self._entries.pop((rid, "kv"), None)
            if entry is None:
                return None
            self._bytes -= entry[1]
            kv: TurnKV = entry[0]
            return kv

    def keep_kv(self, rid: str, kv: TurnKV, cancelled: threading.Event) -> None:
        """Keep ``kv`` as ``rid``'s K/V unless ``cancelled`` is set (checked under the lock, so
        an abort that releases the request after this check also drops it)."""
        self._keep((rid, "kv"), kv, kv.nbytes, cancelled)

    def count_prefill(self, reused: int, prefilled: int) -> None:
        with self._lock:
            self._stats.reused_tokens += reused
            self._stats.prefilled_tokens += prefilled

    # --- lifetime ----------------------------------------------------------------------------
    def release(self, rid: str) -> int:
        """Drop everything ``rid`` holds; returns the bytes freed."""
        with self._lock:
            freed = 0
            for key in [k for k in self._entries if k[0] == rid]:
                freed += self._entries.pop(key)[1]
            self._bytes -= freed
            return freed

    def held(self, rid: str) -> int:
        """Bytes ``rid``'s context holds."""
        with self._lock:
            return sum(size for key, (_, size) in self._entries.items() if key[0] == rid)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """``bytes`` held, ``budget``, ``requests`` holding a context, media ``hits`` and
        ``misses``, ``evictions``, prompt tokens ``reused`` from a kept K/V and ``prefilled``."""
        with self._lock:
            s = self._stats
            return {"bytes": self._bytes, "budget": self.budget,
                    "requests": len({k[0] for k in self._entries}), "hits": s.hits,
                    "misses": s.misses, "evictions": s.evictions,
                    "reused_tokens": s.reused_tokens, "prefilled_tokens": s.prefilled_tokens}

    def _keep(self, key: tuple[str, str], value: Any, size: int,
              cancelled: threading.Event | None) -> None:
        with self._lock:
            if cancelled is not None and cancelled.is_set():
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.budget:
                self._stats.evictions += 1
                return
            while self._entries and self._bytes + size > self.budget:
                _, (_, freed) = self._entries.popitem(last=False)
                self._bytes -= freed
                self._stats.evictions += 1
            self._entries[key] = (value, size)
            self._bytes += size
