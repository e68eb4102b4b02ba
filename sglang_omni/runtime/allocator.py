"""Keep glibc's allocator from holding on to the memory of large, short-lived buffers.

glibc serves an allocation above its mmap threshold (128 KiB at first) with its own mapping,
returned to the system when freed, but raises that threshold to the size of each such block
freed, up to 32 MiB. After the first request that carried megabyte media (an 8 MiB video
inline: its base64 text, JSON strings, wire frames), later buffers of that size would come from
the heap arenas instead, whose freed memory may stay with the process.
:func:`bound_large_allocations` fixes the threshold at 1 MiB in this process (``mallopt``; a fixed
threshold is never raised) and, through ``MALLOC_MMAP_THRESHOLD_``, in the stage processes it
starts afterwards. An operator's own ``MALLOC_MMAP_THRESHOLD_`` is kept; on a C library without
``mallopt`` nothing changes. (The creep across worst-case requests that
``benchmarks/memory_creep.py`` first showed was mostly not the allocator but references a
finished request left behind: see docs/operations.md, "Memory, measured".)
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("sglang_omni.runtime")

#: glibc's ``mallopt`` parameter number of the mmap threshold.
M_MMAP_THRESHOLD = -3
#: Allocations of at least this many bytes get their own mapping, freed back to the system.
MMAP_THRESHOLD = 1024 * 1024
ENV = "MALLOC_MMAP_THRESHOLD_"


def bound_large_allocations(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix the mmap threshold at ``threshold`` bytes here and for child processes (see the
    module contract); True when this process's allocator took it."""
    if os.environ.get(ENV):
        return False  # the operator's choice, already read by this process's allocator
    os.environ[ENV] = str(threshold)  # the stage processes' allocators read it at start
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    taken = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not taken:
        log.info("the C library refused mallopt(M_MMAP_THRESHOLD); large buffers may stay "
                 "with the process after use")
    return taken
