"""The gateway's waiting room: how many planned calls may wait at once for a replica that admits
them (``--max-waiting``); beyond them a call is sent to be admitted now or refused."""

from __future__ import annotations

import logging

log = logging.getLogger("sglang_omni.scale")


class WaitingRoom:
    """Counts the planned calls that have not reached a replica yet (those the deadline router
    may hold); ``enter`` says whether one more may wait. Used from the gateway's event loop."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.waiting = 0
        self._full_logged = False

    def enter(self) -> bool:
        """Take a place (True), or False when all ``capacity`` places are taken."""
        if self.waiting >= self.capacity:
            if self.capacity and not self._full_logged:
                self._full_logged = True
                log.warning("%d requests are waiting at this gateway for a replica that admits "
                            "them (--max-waiting); more are refused at once when no replica "
                            "admits them", self.waiting)
            return False
        self.waiting += 1
        return True

    def leave(self) -> None:
        self.waiting -= 1
        if self._full_logged and self.waiting < self.capacity // 2:
            self._full_logged = False
