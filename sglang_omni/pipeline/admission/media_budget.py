"""The server-wide byte budget for the client media that running requests hold.

A request's client media are read by the server (fetched, decoded from inline data, read from
local files) and then kept by the Reasoner stage until the request ends; the server drops its
copy once the stage holds the items. A direct generation's media (an edit's image, a video's
``image_path``/``video_path``, an action's observation) are read by the generation stage while
it runs the generation, and count from the request's admission until that generation ends. So
each process holds at most the budget's bytes of client media: ``server.max_client_media_bytes``
(4 GiB by default: max_active 32 requests at max_retained_bytes 128 MiB each, the spec's
arithmetic).

Admission (:meth:`MediaBudget.reserve`) happens before any fetch: a request reserves the most
its media may take (:func:`worst_case_bytes`: each remote or local part the per-fetch size
limit, each inline part its decoded size, all of them at most ``max_media_bytes``) and is
refused with 503 and Retry-After when that does not fit beside what the running requests hold.
Once its media are read the reservation settles to their real size
(:meth:`MediaReservation.settle`), and it is released exactly once: as the request's answer
is complete (its last byte handed to the server: the request reads no media after it, and its
state may take a while longer to be released), or when the request ends otherwise, however it
ends (:meth:`MediaReservation.release` is idempotent; the request's answer and its release
both run it).

Used from one event loop: ``reserve`` never awaits, so the check and the count are atomic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sglang_omni.errors import MediaRefused, ServiceUnavailable
from sglang_omni.media import MediaPolicy
from sglang_omni.media.content_parts import MEDIA_PART_KINDS, iter_content_parts
from sglang_omni.media.policy import InlineMedia

#: The setting, for messages.
BUDGET_FLAG = "--server.max_client_media_bytes"
#: References this long are inline data (no path is this long); their decoded size is bounded
#: by their length instead of parsing them on the event loop.
_LONG_REF = 64 * 1024
_REMOTE = ("http://", "https://")


class MediaReservation:
    """The bytes one request counts against the budget: ``amount`` (its worst case until
    :meth:`settle`, then what its media took)."""

    def __init__(self, budget: MediaBudget, amount: int) -> None:
        self._budget = budget
        self.amount = amount
        self.released = False

    def settle(self, amount: int) -> None:
        """Count ``amount`` bytes from now on (the media's real size, once read)."""
        if self.released:
            return
        self._budget.held += amount - self.amount
        self.amount = amount

    def release(self) -> None:
        """Stop counting the request's bytes; idempotent."""
        if not self.released:
            self.released = True
            self._budget.held -= self.amount
            self.amount = 0


class MediaBudget:
    """Client media bytes held by the running requests, against ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Bytes the running requests hold or reserved.
        self.held = 0
        #: Called with the reason ``media_budget`` when a request is refused (the metrics).
        self.on_refused: Callable[[], None] | None = None

    def reserve(self, amount: int) -> MediaReservation:
        """Count ``amount`` bytes for a request; ServiceUnavailable (503, Retry-After)
        when they do not fit beside the bytes held. A request with no client media takes an
        empty reservation and is never refused here."""
        if amount > 0 and self.held + amount > self.limit:
            if self.on_refused is not None:
                self.on_refused()
            raise ServiceUnavailable(
                f"the request's media may take {amount} bytes, and the running requests "
                f"hold {self.held} of the server's {self.limit} bytes for client media "
                f"({BUDGET_FLAG}); retry later, or send fewer or smaller media")
        self.held += amount
        return MediaReservation(self, amount)

    def report(self) -> dict[str, int]:
        """``client_media_bytes`` (held or reserved now) and ``max_client_media_bytes``."""
        return {"client_media_bytes": self.held, "max_client_media_bytes": self.limit}


def worst_case_bytes(messages: Iterable[Any], policy: MediaPolicy) -> int:
    """The most bytes the client media of ``messages`` may take once read under ``policy``:
    :func:`refs_worst_case` of their media parts' references."""
    return refs_worst_case((part.url for part in iter_content_parts(list(messages))
                            if part.kind in MEDIA_PART_KINDS.values() and part.url is not None),
                           policy)


def refs_worst_case(refs: Iterable[str], policy: MediaPolicy) -> int:
    """The most bytes the media references ``refs`` may take once read under ``policy``:
    each distinct reference counted once (a request reads it once), remote and local ones at
    the per-fetch limit, inline ones (``data:`` URLs, bare base64) at their decoded size; at
    most ``max_media_bytes``. A reference the policy refuses counts nothing (the read refuses
    it, 400)."""
    cap = policy.max_media_bytes
    per_part = policy.max_bytes if policy.max_bytes is not None else cap
    seen: set[str] = set()
    total = 0
    for url in refs:
        if url in seen:
            continue
        seen.add(url)
        total += _part_bytes(url, policy, per_part, cap)
        if cap is not None and total >= cap:
            return cap
    return total


def _part_bytes(url: str, policy: MediaPolicy, per_part: int | None, cap: int | None) -> int:
    largest = per_part if per_part is not None else cap
    if url[:8].lower().startswith(_REMOTE) or url[:7].lower() == "file://":
        return largest if largest is not None else 0
    if len(url) >= _LONG_REF:
        return len(url) * 3 // 4 + 3
    try:
        source = policy.resolve(url, label="")
    except MediaRefused:
        return 0
    if isinstance(source, InlineMedia):
        return source.payload.decoded_size
    return largest if largest is not None else 0
