"""How many GPUs a native generation server spans, from its server arguments (no sglang import:
the action route's metadata reads it too)."""

from __future__ import annotations

from typing import Any

#: The native server arguments that spread a generation over several GPUs.
PARALLEL_ARGS = ("num_gpus", "tp_size", "sp_degree", "ulysses_degree", "ring_degree")


def native_gpu_count(engine_args: dict[str, Any]) -> int:
    """How many GPUs the native server arguments give the generation (``num_gpus``, else the
    largest parallel degree, else 1)."""
    values = [engine_args.get(k) for k in PARALLEL_ARGS]
    return max([1, *(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))])
