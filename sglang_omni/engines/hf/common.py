"""What both hf engines share: engine options, device and dtype, and the serial model thread."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.engines.memory_faults import call_freeing_on_oom

log = logging.getLogger("sglang_omni.hf")
T = TypeVar("T")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class JobCancelled(Exception):
    """Raised on the model thread when the job's ``cancelled`` flag stops the model."""


def step_callback(job: Job, steps: int, what: str) -> Callable[..., dict[str, Any]]:
    """A diffusers ``callback_on_step_end`` for a job of ``steps`` denoising steps: it reports
    each step as a ``{"step", "steps"}`` chunk and stops the pipeline (:class:`JobCancelled`)
    after the step during which the job was cancelled; ``what`` names the work in the log."""

    def on_step_end(pipe: Any, index: int, timestep: Any,
                    tensors: dict[str, Any]) -> dict[str, Any]:
        if job.cancelled.is_set():
            log.info("request %s: %s cancelled after step %d of %d", job.rid, what, index + 1,
                     steps)
            raise JobCancelled()
        job.emit({"step": index + 1, "steps": steps})
        return {}

    return on_step_end


def engine_options(spec: EngineSpec, defaults: dict[str, Any]) -> dict[str, Any]:
    """``stages.<stage>.engine`` merged over ``defaults``; an unknown key stops startup."""
    unknown = sorted(set(spec.engine) - set(defaults))
    if unknown:
        raise RuntimeError(
            f"stages.{spec.stage}.engine.{unknown[0]}: not an option of the hf backend; it takes "
            f"{', '.join(sorted(defaults))}")
    options = {**defaults, **spec.engine}
    if options.get("dtype", "auto") not in DTYPES:
        raise RuntimeError(f"stages.{spec.stage}.engine.dtype: {options['dtype']!r} is not one "
                           f"of {', '.join(DTYPES)}")
    return options


def torch_device(spec: EngineSpec) -> Any:
    """The stage's device: its GPU (the only one the stage process sees) or the CPU."""
    import torch

    if spec.gpu is None:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"stages.{spec.stage}.gpu: {spec.gpu} is set but torch sees no CUDA "
                           "device; set it to null to run the hf backend on the CPU")
    if spec.gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(spec.gpu_memory_fraction, 0)
    return torch.device("cuda", 0)


def torch_dtype(name: str, device: Any) -> Any:
    """``auto`` is float32 on the CPU and bfloat16 on a GPU."""
    import torch

    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


class ModelThread:
    """Runs blocking model calls one at a time, in submission order, on one thread (or on
    ``workers`` threads, see ``__init__``).

    A model object must not run two calls at once (an out-of-memory included: the next call
    starts once the failed one's memory is freed). Cancelling the awaiting task drops a call
    that has not started; a running call stops at its own next check of ``job.cancelled``, and
    the next call starts only after it returned.
    """

    def __init__(self, spec: EngineSpec, workers: int = 1) -> None:
        """With ``workers`` > 1, a call paused at a denoising step boundary (the generation
        stage's GPU turns) keeps its thread while others run; a call still computes only while
        it holds the model (a lock: :meth:`set_aside` lends it out while the call waits), so a
        cancelled call that has not returned yet never overlaps the next one."""
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{spec.stage}-model")
        self._model = threading.Lock()
        self.stage, self.role = spec.stage, spec.role

    async def call(self, fn: Callable[..., T], *args: Any,
                   release: Callable[[], None] | None = None) -> T:
        """``fn(*args)`` on the thread. An allocation failure (``memory_faults``) raises
        ``OutOfGPUMemory`` after ``release()`` dropped what the engine keeps for the request
        and the memory the call held is freed, before the next call starts."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, partial(self._holding, partial(
                call_freeing_on_oom, self.stage, self.role, fn, *args, release=release)))

    def _holding(self, fn: Callable[[], T]) -> T:
        with self._model:
            return fn()

    @contextmanager
    def set_aside(self) -> Iterator[None]:
        """From a call on the thread: let other calls have the model during the ``with`` block
        (a pause at a step boundary); the call has it back after."""
        self._model.release()
        try:
            yield
        finally:
            self._model.acquire()

    async def load(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the thread, its errors as raised (the model's load fails the start-up)."""
        await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def prefetch_weights(model_path: str) -> int:
    """Ask the kernel to read every ``*.safetensors`` file under ``model_path`` into the page
    cache now (``posix_fadvise`` WILLNEED: the reads run in the background), so the load that
    follows the engine's imports finds them there; the number of files asked for. A file that
    cannot be opened is skipped (the load reports it)."""
    asked = 0
    for path in sorted(Path(model_path).rglob("*.safetensors")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            asked += 1
        except OSError as exc:
            log.debug("prefetching %s: %s", path, exc)
        finally:
            os.close(fd)
    return asked


def init_cuda() -> None:
    """Initialise CUDA (driver and the device's context) now."""
    import torch

    torch.cuda.init()


def _quietly(what: str, fn: Callable[[], object],
             took: dict[str, float] | None = None, part: str = "") -> Callable[[], None]:
    """``fn`` with its errors logged, not raised; its seconds go to ``took[part]``."""
    def run() -> None:
        began = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the load that follows meets it and reports it
            log.debug("%s (ahead of the load) failed: %r", what, exc)
        if took is not None:
            took[part] = time.perf_counter() - began

    return run


class ThreadedModelEngine:
    """Base of the hf engines: the model loads and runs on one ``ModelThread``.

    Subclasses set ``self.thread`` and ``self.spec`` in ``__init__`` and implement ``_load``
    (run on the thread), recording its parts' seconds in ``self.parts`` (``imports``,
    ``weights``, ``warm-up``). While ``_load`` imports its libraries, the checkpoint's weight
    files are read ahead (:func:`prefetch_weights`) and, for a stage on a GPU, CUDA initialises
    (:func:`init_cuda`) on threads of their own; ``start()`` returns after both ended.
    :meth:`startup_parts` gives both sets of seconds to the stage's ready line.
    """

    thread: ModelThread
    spec: EngineSpec
    #: The start's parts, in turn, and the work that ran beside them (seconds each).
    parts: dict[str, float]
    beside: dict[str, float]

    async def start(self) -> None:
        self.parts, self.beside = {}, {}
        ahead = [threading.Thread(target=_quietly("prefetching the weights", lambda: (
            prefetch_weights(str(self.spec.model_path))), self.beside, "weights read-ahead"),
            name="weights-prefetch", daemon=True)]
        if self.spec.gpu is not None:
            ahead.append(threading.Thread(
                target=_quietly("initialising CUDA", init_cuda, self.beside, "CUDA init"),
                name="cuda-init", daemon=True))
        for thread in ahead:
            thread.start()
        try:
            await self.thread.load(self._load)
        finally:
            for thread in ahead:
                await asyncio.to_thread(thread.join)

    async def close(self) -> None:
        self.thread.close()

    def startup_parts(self) -> tuple[dict[str, float], dict[str, float]]:
        """Where the start's seconds went: its parts in turn (imports, weights, warm-up), and
        what ran beside them (the weights' read-ahead, CUDA's initialisation)."""
        return dict(getattr(self, "parts", {})), dict(getattr(self, "beside", {}))

    def _load(self) -> None:
        raise TypeError(f"{type(self).__name__} must define _load")


def to_uint8(video: Any) -> Any:
    """Frames in [0, 1] (an array the request owns, changed in place) as RGB uint8: the values
    ``(clip(x, 0, 1) * 255).round()`` gives, without its full-size temporaries (measured on a
    1280x720 33-frame video: 0.1 s in place against 0.3-2 s with them)."""
    import numpy as np

    frames = np.asarray(video, dtype=np.float32)
    if not frames.flags.writeable:
        frames = frames.copy()
    np.clip(frames, 0.0, 1.0, out=frames)
    frames *= 255.0
    np.rint(frames, out=frames)
    return frames.astype(np.uint8)
