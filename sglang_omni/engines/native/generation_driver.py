"""The pinned SGLang's ``DiffGenerator`` behind the small surface the generation engine uses.

Every call here blocks; the engine runs them on threads of its own. sglang is imported only in
this module's methods. ``SGLANG_OMNI_DIFFUSION_DRIVER=module:Class`` replaces
:class:`SGLangDiffusion` with another implementation of :class:`DiffusionDriver` (the tests run
the engine over a fake one this way).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sglang_omni.config.model_imports import load_named
from sglang_omni.engines.native.root_logging import kept_root_logging
from sglang_omni.errors import NativeRefusal

DRIVER_ENV = "SGLANG_OMNI_DIFFUSION_DRIVER"
_GENERATOR_LOGGER = "sglang.multimodal_gen.runtime.entrypoints.diffusion_generator"


class NativeFailed(RuntimeError):
    """Native SGLang failed a request that returns no media (an action); the message says why."""


@dataclass(frozen=True)
class NativeOutput:
    """A finished image or video generation: the file native wrote, or None and the reason."""

    path: str | None
    reason: str | None = None


class WorkerProcess(Protocol):
    """What the engine watches of a native worker (``multiprocessing.Process`` has it)."""

    name: str
    pid: int | None
    sentinel: int
    exitcode: int | None


class DiffusionDriver(Protocol):
    def native_abort(self) -> str | None:
        """The name of a native abort method, or None when native cannot cancel."""

    def register_own_plugins(self) -> None:
        """Run this process's plugin registration (before the plugin is put on its path)."""

    def start(self, server_kwargs: dict[str, Any]) -> None:
        """Load the model and start the native workers."""

    def workers(self) -> list[WorkerProcess]: ...

    def ffmpeg(self) -> str:
        """The FFmpeg executable native SGLang muxes audio with."""

    def generate(self, kwargs: dict[str, Any]) -> NativeOutput:
        """One image or video; NativeRefusal for parameters native refuses."""

    def generate_action(self, request: dict[str, Any], folder: str) -> dict[str, Any]:
        """One native action-route request (its JSON body); returns the JSON response body.
        NativeRefusal for a request native refuses, NativeFailed when it produced nothing."""

    def abort(self, request_id: str) -> None:
        """Cancel ``request_id`` natively (only when ``native_abort()`` named a method)."""

    def release(self) -> None:
        """After a worker died: unblock a call waiting on it; the driver is unusable after."""

    def shutdown(self) -> None: ...


def load_driver() -> DiffusionDriver:
    """:class:`SGLangDiffusion`, or the class ``SGLANG_OMNI_DIFFUSION_DRIVER`` names."""
    path = os.environ.get(DRIVER_ENV)
    if not path:
        return SGLangDiffusion()
    return load_named(path)()


class _ReasonLog(logging.Handler):
    """Keeps the last warning or error native logs on one thread (why it returned nothing)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.thread = threading.get_ident()
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.last = record.getMessage()


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    return value


class SGLangDiffusion:
    """``sglang.multimodal_gen.DiffGenerator`` in local mode (it spawns the workers)."""

    def __init__(self) -> None:
        self.generator: Any = None

    @staticmethod
    def _generator_cls() -> Any:
        from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator

        return DiffGenerator

    def native_abort(self) -> str | None:
        from sglang_omni.engines.native.generation_cancellation import native_abort_method

        return native_abort_method(self._generator_cls())

    def register_own_plugins(self) -> None:
        from sglang.multimodal_gen.runtime.platforms.plugins import load_plugins

        load_plugins()

    def start(self, server_kwargs: dict[str, Any]) -> None:
        with kept_root_logging():  # native installs its own root handlers
            self.generator = self._generator_cls().from_pretrained(local_mode=True,
                                                                   **server_kwargs)

    def workers(self) -> list[WorkerProcess]:
        return list(self.generator.local_scheduler_process or [])

    def ffmpeg(self) -> str:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()

    def generate(self, kwargs: dict[str, Any]) -> NativeOutput:
        reasons = _ReasonLog()
        logger = logging.getLogger(_GENERATOR_LOGGER)
        logger.addHandler(reasons)
        try:
            result = self.generator.generate(sampling_params_kwargs=kwargs)
        except (ValueError, TypeError) as exc:
            raise NativeRefusal(str(exc)) from None
        finally:
            logger.removeHandler(reasons)
        if isinstance(result, list):
            result = result[0] if len(result) == 1 else None
            if result is None:
                return NativeOutput(None, "native SGLang returned more than one output")
        if result is None:
            return NativeOutput(None, reasons.last or "native SGLang returned no output")
        path = getattr(result, "output_file_path", None)
        if not path:
            return NativeOutput(None, "native SGLang returned no output file")
        return NativeOutput(str(path))

    def generate_action(self, request: dict[str, Any], folder: str) -> dict[str, Any]:
        from sglang.multimodal_gen.runtime.entrypoints.action import protocol
        from sglang.multimodal_gen.runtime.entrypoints.utils import prepare_request
        from sglang.multimodal_gen.runtime.scheduler_client import sync_scheduler_client

        server_args = self.generator.server_args
        runtime = request.get("runtime") or {}
        response_format = str(runtime.get("response_format", "envelope")).lower()
        try:
            if response_format not in ("envelope", "raw"):
                raise ValueError("runtime.response_format must be 'envelope' or 'raw'")
            sampling = protocol.build_action_sampling_params(request, server_args)
            sampling.output_path = folder  # the cancellation plugin looks here
            req = prepare_request(server_args=server_args, sampling_params=sampling)
        except (ValueError, TypeError) as exc:
            raise NativeRefusal(str(exc)) from None
        output_batch = sync_scheduler_client.forward(req)
        if getattr(output_batch, "error", None):
            raise NativeFailed(str(output_batch.error))
        if output_batch.output is None:
            raise NativeFailed("action policy returned no output")
        output = output_batch.output[0]
        if response_format == "raw":
            return _json_safe(protocol.action_raw_response(output))
        return _json_safe(protocol.action_generation_response(output, server_args))

    def abort(self, request_id: str) -> None:
        method: Callable[[str], Any] = getattr(self.generator, self.native_abort() or "")
        method(request_id)

    def release(self) -> None:
        from sglang.multimodal_gen.runtime.scheduler_client import sync_scheduler_client

        # Terminating the client's ZMQ context makes a receive blocked on the dead worker
        # fail at once; the generator logs it and returns nothing.
        sync_scheduler_client.close()

    def shutdown(self) -> None:
        if self.generator is not None:
            self.generator.shutdown()
            self.generator = None
