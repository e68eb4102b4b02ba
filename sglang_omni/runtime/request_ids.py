"""Request ids: every request gets a fresh one; a client-sent id may never be reused."""

from __future__ import annotations

import uuid
from collections import OrderedDict

from sglang_omni.errors import BadRequest


class RequestIds:
    """Hands out request ids and refuses a client id that is in use or was used before.

    Remembers the last ``capacity`` ids (a bounded memory; ids older than that are forgotten).
    """

    def __init__(self, capacity: int = 1_000_000) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def claim(self, client_id: object = None) -> str:
        """A fresh id, or ``client_id`` if it was never used; BadRequest otherwise."""
        if client_id is None:
            rid = uuid.uuid4().hex
        else:
            if not isinstance(client_id, str) or not client_id or len(client_id) > 256:
                raise BadRequest("rid: expected a non-empty string of at most 256 characters")
            rid = client_id
            if rid in self._seen:
                raise BadRequest(
                    f"rid: request id {rid!r} is already in use or was used before; use a fresh "
                    "request ID for every request (or leave rid out)"
                )
        self._seen[rid] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return rid
