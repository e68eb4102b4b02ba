"""Out-of-memory inside an engine: how it is recognised, what the client is told, how the stage
gives back what the failed request held, and what the stage reports of its device memory.

An allocation error raised while an engine serves a request (``torch.OutOfMemoryError``, a
``RuntimeError`` subclass, or the same error text from a library that wraps it) fails that
request only, with :class:`~sglang_omni.errors.OutOfGPUMemory` (500 ``server_error``): the stage
drops the error's traceback (whose frames hold the request's tensors), runs the garbage
collector and empties the CUDA cache, so its allocated memory is back to what it was before the
request, and the stage serves the next request without a restart.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from sglang_omni.errors import OutOfGPUMemory

log = logging.getLogger("sglang_omni.memory")
T = TypeVar("T")

#: Texts of an allocation failure in an exception's message: PyTorch's caching allocator, a CUDA
#: kernel or library that could not allocate, PyTorch's CPU allocator.
OOM_MARKERS = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
               "DefaultCPUAllocator: can't allocate memory")
#: What each stage role's client can change, and the stage key that gives the stage more memory.
HINTS = {
    "generation": "ask for a smaller width and height or fewer num_frames",
    "reasoner": "send fewer or smaller images and videos, a shorter conversation or a smaller "
                "max_tokens",
}
#: The first characters of the engine's own message kept in the answer.
DETAIL_CHARS = 300


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (see :data:`OOM_MARKERS`)."""
    torch = sys.modules.get("torch")
    oom_class = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_class is not None and isinstance(exc, oom_class):
        return True
    return isinstance(exc, RuntimeError) and says_out_of_memory(str(exc))


def says_out_of_memory(text: str | None) -> bool:
    """Whether an engine's failure reason (native SGLang's, say) is an allocation failure."""
    return bool(text) and any(m in str(text) for m in OOM_MARKERS)


def out_of_memory_error(stage: str, role: str, detail: str,
                        freed: bool = True) -> OutOfGPUMemory:
    """The client's error for an allocation failure in ``stage`` (``detail``: the engine's
    message, cut to :data:`DETAIL_CHARS`); ``freed``: the stage itself freed what the request
    held (False where native SGLang's worker holds the memory and ended the request)."""
    first = detail.strip().splitlines()[0] if detail.strip() else "no detail"
    if len(first) > DETAIL_CHARS:
        first = first[:DETAIL_CHARS] + "..."
    what = "memory" if "CPUAllocator" in detail else "GPU memory"
    hint = HINTS.get(role, "send a smaller request")
    after = "The stage freed what the request held and serves other requests" if freed else \
        "Native SGLang ended the request; the stage serves other requests"
    return OutOfGPUMemory(
        f"the {stage} stage ran out of {what} for this request ({first}); {hint}, or give the "
        f"stage more memory (a larger stages.{stage}.gpu_memory_fraction, or a GPU of its own). "
        f"{after}")


def free_device_memory() -> None:
    """Collect garbage (the failed request's tensors in reference cycles) and give the CUDA
    cache's unused blocks back to the device, where torch has initialised CUDA."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def device_memory() -> dict[str, int] | None:
    """``{"allocated", "reserved", "peak"}`` bytes of this process's CUDA device (the PyTorch
    caching allocator's counters), or None where torch has not initialised CUDA (a CPU stage,
    a scripted one, a native one whose model runs in child processes)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        return {"allocated": int(torch.cuda.memory_allocated()),
                "reserved": int(torch.cuda.memory_reserved()),
                "peak": int(torch.cuda.max_memory_allocated())}
    except RuntimeError as exc:  # a broken CUDA context: nothing to report
        log.warning("reading the device's memory counters failed: %s", exc)
        return None


def call_freeing_on_oom(stage: str, role: str, fn: Callable[..., T], *args: Any,
                        release: Callable[[], None] | None = None) -> T:
    """``fn(*args)``; an allocation failure is raised as :func:`out_of_memory_error` once the
    original error (and the frames its traceback holds) is dropped, ``release()`` (what the
    engine keeps for the request) has run and the memory is freed."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - only allocation failures are handled here
        if not is_out_of_memory(exc):
            raise
        detail = str(exc)
        log.error("%s: out of memory: %s", stage, detail.splitlines()[0] if detail else exc)
    # Outside the except block: the error and its traceback are gone, so their tensors are too.
    if release is not None:
        release()
    free_device_memory()
    raise out_of_memory_error(stage, role, detail)
