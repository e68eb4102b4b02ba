"""The ``omni_generation_cancellation`` plugin: stops a cancelled native generation mid-denoising.

It runs inside the native generation workers that the generation stage starts (the stage
provides it to them alone, see ``cancellation_plugin_site``); the multimodal_gen plugin loader
calls :func:`register` once per worker. A request counts as cancelled once its native output
folder (the ``output_path`` Omni gives every request) holds :data:`CANCEL_MARKER`; the stage
writes that file when the request is aborted or its client goes away. Two hooks on the Cosmos3
denoising loop of the pinned SGLang release act on it:

* around ``Cosmos3DenoisingStage._denoise_once`` (one denoising loop): makes the batch's output
  folder the loop's request and checks for the marker before the first step;
* before ``Cosmos3OmniTransformer.set_denoising_step`` (the head of every step): raises
  :class:`GenerationCancelled` when the loop's request is cancelled, and otherwise records the
  step in the folder's :data:`PROGRESS_FILE` (``"step steps"``, steps done so far), which the
  stage reads to report progress (:func:`read_progress`).

Native SGLang turns the exception into a failed request and keeps the worker serving, so the
worker is free again within about one denoising step. The hooks assume one worker per
generation: with several GPUs the ranks could see the marker at different steps, so the stage
does not provide the plugin then.

This module imports only the standard library at module level; sglang is imported inside
:func:`register`, in the worker.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

PLUGIN_NAME = "omni_generation_cancellation"
ENTRY_POINT_GROUP = "sglang.multimodal_gen.plugins"
CANCEL_MARKER = ".omni-cancelled"
PROGRESS_FILE = ".omni-progress"
#: Set by the stage for its workers: where each worker reports that it registered the hooks.
STATUS_DIR_ENV = "SGLANG_OMNI_CANCELLATION_STATUS_DIR"

_STAGES = "sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages"
DENOISE_LOOP = f"{_STAGES}.cosmos3.Cosmos3DenoisingStage._denoise_once"
DENOISING_STEP = ("sglang.multimodal_gen.runtime.models.dits.cosmos3video."
                  "Cosmos3OmniTransformer.set_denoising_step")
HOOK_TARGETS = (DENOISE_LOOP, DENOISING_STEP)

log = logging.getLogger("sglang_omni.cancellation_plugin")

_loop_folder: ContextVar[str | None] = ContextVar("omni_denoising_request", default=None)


class GenerationCancelled(RuntimeError):
    """The request running this denoising loop was cancelled by SGLang Omni."""


def cancel_requested(folder: str | None) -> bool:
    """Whether the request whose native output folder is ``folder`` was cancelled."""
    if not folder:
        return False
    return os.path.exists(os.path.join(folder, CANCEL_MARKER))


def request_cancel(folder: str | os.PathLike[str]) -> None:
    """Mark the request owning ``folder`` cancelled (the stage side; idempotent)."""
    with open(os.path.join(folder, CANCEL_MARKER), "a", encoding="utf-8"):
        pass


@contextmanager
def denoising_request(folder: str | None) -> Iterator[None]:
    """Make ``folder`` the request of the denoising loop running inside the block."""
    token = _loop_folder.set(folder)
    try:
        yield
    finally:
        _loop_folder.reset(token)


def report_step(folder: str | None, step: int | None, steps: int | None) -> None:
    """Record that ``step`` of ``steps`` denoising steps are done (atomically; best effort)."""
    if not folder or step is None:
        return
    path = os.path.join(folder, PROGRESS_FILE)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"{int(step)} {int(steps) if steps is not None else 0}")
        os.replace(path + ".tmp", path)
    except (OSError, ValueError, TypeError):
        return  # progress is a report, never a failure


def read_progress(folder: str | os.PathLike[str]) -> tuple[int, int | None] | None:
    """``(step, steps)`` last recorded in ``folder`` (``steps`` None when unknown), or None."""
    try:
        with open(os.path.join(folder, PROGRESS_FILE), encoding="utf-8") as f:
            step, steps = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return step, steps or None


def _stop_if_cancelled(where: str) -> None:
    folder = _loop_folder.get()
    if cancel_requested(folder):
        log.info("native generation in %s cancelled %s", folder, where)
        raise GenerationCancelled(f"cancelled by SGLang Omni {where}")


def around_denoise_loop(original: Callable[..., Any], stage: Any, batch: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND hook of ``_denoise_once``: scope the loop to the batch's request."""
    with denoising_request(getattr(batch, "output_path", None)):
        _stop_if_cancelled("before its first denoising step")
        return original(stage, batch, *args, **kwargs)


def before_denoising_step(transformer: Any, step_index: int | None = None,
                          num_steps: int | None = None) -> None:
    """BEFORE hook of ``set_denoising_step``: stop a cancelled request at this step's head;
    else record the steps done so far (``step_index``, 0-based, is the step starting)."""
    _stop_if_cancelled(f"at denoising step {step_index} of {num_steps}")
    report_step(_loop_folder.get(), step_index, num_steps)


def register() -> None:
    """The plugin entry point: register both hooks (the loader applies them afterwards)."""
    from sglang.multimodal_gen.runtime.platforms.plugins import HookType, plugin_hook

    plugin_hook(DENOISE_LOOP, type=HookType.AROUND)(around_denoise_loop)
    plugin_hook(DENOISING_STEP, type=HookType.BEFORE)(before_denoising_step)
    report_registered()


def report_registered() -> None:
    """Leave this worker's report in the stage's status folder (when the stage set one)."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir or not os.path.isdir(status_dir):
        return
    report = {"pid": os.getpid(), "process": multiprocessing.current_process().name,
              "targets": list(HOOK_TARGETS)}
    path = os.path.join(status_dir, f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)
