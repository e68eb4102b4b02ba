"""Keeping a stage's logging while native SGLang starts in its process.

Native SGLang configures the root logger of the process that starts it (``configure_logger``:
``logging.basicConfig(force=True)`` for the Reasoner's ``Engine``, new root handlers for the
generation's ``DiffGenerator``), which would replace the stage's format (``--log-format``) for
the rest of its life, Omni's own lines included. Native's child processes are not affected by
this: they configure their own logging (see ``runtime.log_format``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def kept_root_logging() -> Iterator[None]:
    """Run the block, then put back the root logger's handlers and level as they were before
    it (whether it raised or not); records logged inside go to whatever it installed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
