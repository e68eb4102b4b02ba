"""What the server process sets up before it serves, from the process layer (``runtime``):
its logging, its allocator bound, and the development aid that times slow event-loop callbacks.
The HTTP layer (serve/) reaches runtime/ only through pipeline/ (an import-graph rule), so it
takes these from here."""

from __future__ import annotations

from sglang_omni.runtime import loop_watch
from sglang_omni.runtime.allocator import bound_large_allocations
from sglang_omni.runtime.log_format import configure_logging

__all__ = ["bound_large_allocations", "configure_logging", "loop_watch"]
