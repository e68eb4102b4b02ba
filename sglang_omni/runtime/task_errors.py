"""Background tasks' errors: a done callback that logs the exception of a task nobody awaits
for its result, so a failure is seen (not a "Task exception was never retrieved" at exit)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


def log_failure(log: logging.Logger, what: str) -> Callable[[asyncio.Task], None]:
    """A done callback for a background task: logs its exception at error level as ``what``
    failed (a cancelled task or one that returned is not logged)."""

    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", what, exc_info=task.exception())

    return done
