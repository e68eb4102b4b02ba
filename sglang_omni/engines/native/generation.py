"""The native generation engine: SGLang's ``DiffGenerator`` and its workers in the stage process.

One generation runs at a time, the oldest first. For each request the engine:

1. makes the request's native output folder under ``factory.output_dir`` and reads its
   ``image_path``/``video_path`` under the media policy (fetched or decoded media land there);
2. passes the generation options to the native sampling parameters (``num_frames`` 1 for an
   image; ``generate_sound`` becomes ``sound_duration``; ``action_horizon`` gives
   ``num_frames`` = horizon + 1) and runs the generation on a thread;
3. reads the generated file back, checks it, and returns its bytes; an action returns the
   native action route's response body;
4. removes the request's folder when the request ends, however it ends.

An abort stops the native generation as the startup's cancellation plan says
(``generation_cancellation``): the plugin's marker file in the request's folder, a native abort,
or (warned at startup) nothing, in which case the request keeps the stage busy until native
finishes. The stage's workers are watched: when one dies, the running request fails at once
and ``watch()`` reports it, which stops the stage (a dead worker cannot be replaced in place).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import multiprocessing.connection
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

from sglang_omni.aio.race import to_the_end
from sglang_omni.aio.threads import Threads
from sglang_omni.contract.generation_options import DEFAULT_FPS, OPTIONS
from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.parallelism import native_gpu_count
from sglang_omni.contract.payloads import ActionResult, GenerationPayload, MediaResult
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.guardrails import guardrails_state
from sglang_omni.engines.memory_faults import out_of_memory_error, says_out_of_memory
from sglang_omni.engines.native.cancellation_plugin import read_progress, request_cancel
from sglang_omni.engines.native.cancellation_plugin_site import CancellationPluginSite
from sglang_omni.engines.native.generation_cancellation import (
    CancellationPlan,
    plan_cancellation,
)
from sglang_omni.engines.native.generation_checks import (
    AUDIO_FLAG,
    check_audio_checkpoint,
    check_ffmpeg_aac,
    read_generated,
)
from sglang_omni.engines.native.generation_driver import (
    DiffusionDriver,
    NativeFailed,
    NativeOutput,
    WorkerProcess,
    load_driver,
)
from sglang_omni.errors import BadRequest, NativeRefusal, ServerError
from sglang_omni.media import RequestMediaDir, materialize
from sglang_omni.media.action_refs import action_media_refs, replace_action_media
from sglang_omni.media.refs import iter_generation_media_refs
from sglang_omni.media.settings import policy_from_spec
from sglang_omni.media.workdir import owned_prefix, remove_orphans

log = logging.getLogger("sglang_omni.native_generation")

MODALITIES = ("image", "video", "action")
#: Seconds between reads of the denoising step the plugin recorded (progress chunks).
PROGRESS_POLL_S = 0.25
#: The engine's close joins the threads it started within this many seconds (the rest are logged).
THREAD_JOIN_S = 2.0
#: Each request's native output folder under ``output_dir``: ``omni-gen-<host>.<ns>-<pid>-*``.
OUTPUT_PREFIX = "omni-gen-"


def wants_sound(options: dict[str, Any]) -> bool:
    return options.get("generate_sound") is True or float(options.get("sound_duration") or 0) > 0


def sampling_kwargs(modality: str, prompt: str, options: dict[str, Any], *, request_id: str,
                    folder: Path) -> dict[str, Any]:
    """The native sampling parameters of one image or video generation."""
    opts = {k: v for k, v in options.items() if v is not None}
    generate_sound = opts.pop("generate_sound", None)
    horizon = opts.pop("action_horizon", None)
    if modality == "image":
        opts["num_frames"] = 1
    elif horizon is not None:
        opts.setdefault("num_frames", int(horizon) + 1)
    if generate_sound is False:
        opts["sound_duration"] = 0.0
    elif generate_sound is True and "sound_duration" not in opts and "num_frames" in opts:
        opts["sound_duration"] = opts["num_frames"] / opts.get("fps", DEFAULT_FPS)
    elif generate_sound is True and "sound_duration" not in opts:
        raise BadRequest("generate_sound: set num_frames as well, so the sound's duration is "
                         "known")
    return {**opts, "prompt": prompt, "request_id": request_id, "output_path": str(folder),
            "output_file_name": "output", "save_output": True, "return_file_paths_only": True,
            "return_frames": False, "num_outputs_per_prompt": 1}


class NativeGenerator:
    """The ``native`` backend of the generation stage."""

    def __init__(self, spec: EngineSpec, driver: DiffusionDriver | None = None) -> None:
        self.spec = spec
        self.factory = spec.factory
        self.policy = policy_from_spec(spec.media_policy)
        self.output_dir = Path(str(self.factory.get("output_dir") or "outputs")).absolute()
        self.audio = bool(self.factory.get("audio", False))
        self.driver = driver or load_driver()
        self.plan = CancellationPlan("none", "not started")
        self.site: CancellationPluginSite | None = None
        self._turn = asyncio.Lock()
        self._death: asyncio.Future[str] | None = None
        self._workers: list[WorkerProcess] = []
        self._closing = False
        #: The worker watch, a release after a worker died and one thread per native call;
        #: joined by :meth:`close` once the driver shut the workers down.
        self.threads = Threads("native generation")

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._death = loop.create_future()
        self.plan = plan_cancellation(
            plugin_enabled=bool(self.factory.get("cancellation_plugin", True)),
            num_gpus=native_gpu_count(self.spec.engine),
            native_abort=await asyncio.to_thread(self.driver.native_abort),
            env=os.environ)
        if self.plan.warning:
            log.warning("%s", self.plan.warning)
        else:
            log.info("generation cancellation: %s", self.plan.reason)
        log.info("%s", guardrails_state(os.environ)[1])
        if self.audio:
            check_audio_checkpoint(self.spec.model_path)
            await asyncio.to_thread(check_ffmpeg_aac, self.driver.ffmpeg())
            log.info("audiovisual generation is on (%s): checkpoint and FFmpeg AAC checked",
                     AUDIO_FLAG)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        orphans = remove_orphans(self.output_dir, OUTPUT_PREFIX)
        if orphans:
            log.info("removed %d request folder(s) under %s left by a stage process that was "
                     "killed: %s", len(orphans), self.output_dir, ", ".join(orphans[:5]))
        if self.plan.mode == "plugin":
            self.site = CancellationPluginSite()
            self.site.activate(self.driver.register_own_plugins)
        server_kwargs = {**self.spec.engine, "model_path": self.spec.model_path}
        try:
            # The workers' parent-death signal follows the thread that spawns them: the loop's
            # executor threads live until the loop closes, after close() stopped the workers.
            await asyncio.to_thread(self.driver.start, server_kwargs)
        except BaseException:
            if self.site is not None:  # the stage does not close an engine that never started
                self.site.close()
            raise
        self._workers = self.driver.workers()
        if self.site is not None:
            self._check_plugin_loaded(self._workers)
        self.threads.start(self._watch_workers, loop, self._workers, name="native-worker-watch")
        log.info("native generation ready: %d worker(s), output folders under %s",
                 len(self._workers), self.output_dir)

    def _check_plugin_loaded(self, workers: list[WorkerProcess]) -> None:
        assert self.site is not None
        loaded = {r.get("pid") for r in self.site.registrations()}
        missing = [w.name for w in workers if w.pid not in loaded]
        if missing:
            self.plan = CancellationPlan("none", f"the cancellation plugin did not load in "
                                                 f"{', '.join(missing)} (see the log above)")
            log.warning("%s", self.plan.warning)
        else:
            log.info("the cancellation plugin is active in %d native worker(s)", len(workers))

    async def watch(self) -> str:
        """Completes with a message when a native worker died (the stage then stops)."""
        assert self._death is not None
        return await asyncio.shield(self._death)

    async def close(self) -> None:
        """Shut native SGLang down, then join the threads started here (a call's thread ends
        as its worker goes; the worker watch as the workers exit)."""
        self._closing = True
        try:
            await asyncio.to_thread(self.driver.shutdown)
        finally:
            if self.site is not None:
                self.site.close()
            await asyncio.to_thread(self.threads.join, THREAD_JOIN_S)

    def _watch_workers(self, loop: asyncio.AbstractEventLoop,
                       workers: list[WorkerProcess]) -> None:
        if not workers:
            return
        multiprocessing.connection.wait([w.sentinel for w in workers])
        try:
            loop.call_soon_threadsafe(self._check_workers)
        except RuntimeError:
            return

    def _check_workers(self) -> bool:
        """Whether a native worker has exited; the first time, fail and stop (see module)."""
        assert self._death is not None
        if self._death.done():
            return True
        ended = multiprocessing.connection.wait([w.sentinel for w in self._workers], timeout=0)
        dead = next((w for w in self._workers if w.sentinel in ended), None)
        if dead is None or self._closing:
            return False
        deadline = time.monotonic() + 1.0  # its sentinel closes just before it can be reaped
        while dead.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        message = (f"the native generation worker {dead.name} (pid {dead.pid}) exited with "
                   f"code {dead.exitcode}")
        log.error("%s; failing the running request and stopping the generation stage", message)
        self._death.set_result(message)
        self.threads.start(self.driver.release, name="native-release")
        return True

    def _raise_if_dead(self) -> None:
        if self._death is not None and self._death.done():
            raise ServerError(f"{self._death.result()}; the generation stage is stopping and "
                              "the server needs a restart")

    # --- requests ----------------------------------------------------------------------------
    async def run(self, job: Job) -> StageResult:
        payload = cast(GenerationPayload, job.payload)
        modality = payload.get("modality")
        if modality not in MODALITIES:
            raise BadRequest(f"generation modality must be one of {', '.join(MODALITIES)}, got "
                             f"{modality!r}")
        options = self._checked_options(payload.get("options") or {})
        self._raise_if_dead()
        async with self._turn:
            self._raise_if_dead()
            job.emit({"step": 0, "steps": options.get("num_inference_steps")})
            with RequestMediaDir(self.output_dir, prefix=owned_prefix(OUTPUT_PREFIX)) as folder:
                if modality == "action":
                    request = await self._action_request(payload.get("request"), folder)
                    work: Callable[[], Any] = partial(self.driver.generate_action, request,
                                                      str(folder.path))
                else:
                    options = await self._local_media(options, folder)
                    kwargs = sampling_kwargs(modality, str(payload.get("prompt", "")), options,
                                             request_id=job.rid, folder=folder.path)
                    work = partial(self.driver.generate, kwargs)
                outcome = await self._native(job, work, folder.path)
                return await self._deliver(job, modality, outcome, folder.path)

    def _checked_options(self, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise BadRequest(f"generation options not accepted by native generation: "
                             f"{', '.join(unknown)}")
        if wants_sound(options) and not self.audio:
            raise BadRequest(f"audiovisual generation is off on this server; set {AUDIO_FLAG}: "
                             "true (needs the full checkpoint and FFmpeg with AAC) or leave "
                             "generate_sound and sound_duration unset")
        return dict(options)

    async def _action_request(self, body: Any, folder: RequestMediaDir) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the action request body must be a JSON object")
        request = copy.deepcopy(body)
        resolved = {label: await materialize(ref, self.policy, folder, label=label)
                    for label, ref in action_media_refs(request)}
        replace_action_media(request, lambda label, _ref: resolved[label])
        return request

    async def _local_media(self, options: dict[str, Any], folder: RequestMediaDir
                           ) -> dict[str, Any]:
        out = dict(options)
        for label, ref in iter_generation_media_refs(options):
            key = label.split("[", 1)[0]
            value = await materialize(ref, self.policy, folder, label=label)
            if isinstance(out[key], list):
                out[key] = [value if item == ref else item for item in out[key]]
            else:
                out[key] = value
        return out

    async def _native(self, job: Job, work: Callable[[], Any], folder: Path) -> Any:
        """Run ``work`` on a thread; on abort, stop it as planned and wait until it ended.
        Meanwhile the steps the plugin records in ``folder`` are emitted as progress, and so
        is the growth of the files native SGLang writes there (its MP4 encode, after the last
        step, reports nothing else: a slow x264 preset must not look like a hung engine)."""
        assert self._death is not None
        call = _on_thread(work, self.threads)
        reported: tuple[int, int | None] | None = None
        written = 0
        try:
            while not (call.done() or self._death.done()):
                await asyncio.wait({call, self._death}, timeout=PROGRESS_POLL_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                step = read_progress(folder)
                if step is not None and step != reported:
                    reported = step
                    job.emit({"step": step[0], "steps": step[1]})
                if (size := written_bytes(folder)) > written:
                    written = size
                    job.progress()
        except asyncio.CancelledError:
            # to its end even if cancelled again: the worker must be free before the next
            # request (the cancellation is raised once it is)
            await to_the_end(self._stop(job.rid, call, folder))
            raise
        if not call.done() or self._check_workers():
            self._raise_if_dead()  # a worker died: that, not its side effects, is the failure
        try:
            return call.result()
        except NativeRefusal as exc:
            raise BadRequest(f"native SGLang refused the request: {exc}") from None
        except NativeFailed as exc:
            log.warning("request %s: native generation failed: %s", job.rid, exc)
            if says_out_of_memory(str(exc)):
                raise out_of_memory_error(self.spec.stage, "generation", str(exc),
                                          freed=False) from None
            raise ServerError(f"the native generation failed ({exc}); the generation stage log "
                              "has the details") from None

    async def _stop(self, rid: str, call: asyncio.Future, folder: Path) -> None:
        assert self._death is not None
        if self._death.done() or call.done():
            return
        started = time.monotonic()
        if self.plan.mode == "plugin":
            request_cancel(folder)
            log.info("request %s aborted: its native generation stops at the next denoising "
                     "step", rid)
        elif self.plan.mode == "native":
            await asyncio.to_thread(self.driver.abort, rid)
            log.info("request %s aborted: native SGLang cancels its generation", rid)
        else:
            log.warning("request %s aborted, but %s; it keeps the generation stage busy until "
                        "its native generation finishes", rid, self.plan.reason)
        await asyncio.wait({call, self._death}, return_when=asyncio.FIRST_COMPLETED)
        log.info("request %s: native generation ended %.2f s after the abort", rid,
                 time.monotonic() - started)

    async def _deliver(self, job: Job, modality: str, outcome: Any,
                       folder: Path) -> StageResult:
        if modality == "action":
            return StageResult(ActionResult(action=outcome))
        assert isinstance(outcome, NativeOutput)
        if outcome.path is None:
            log.warning("request %s: native SGLang ended the %s generation without media: %s",
                        job.rid, modality, outcome.reason)
            if says_out_of_memory(outcome.reason):  # native reports it as no media
                raise out_of_memory_error(self.spec.stage, "generation", str(outcome.reason),
                                          freed=False)
            return StageResult(MediaResult(media=[], reason=f"native SGLang: {outcome.reason}"))
        data, mime = await asyncio.to_thread(read_generated, outcome.path, folder, modality)
        return StageResult(MediaResult(media=[{"kind": modality, "mime_type": mime, "frame": 0}],
                                       reason=None), [data])


def written_bytes(folder: Path) -> int:
    """The bytes of the files directly in ``folder`` (0 where it is unreadable): what native
    SGLang has written of a request's output so far."""
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total


def _on_thread(work: Callable[[], Any], threads: Threads) -> asyncio.Future:
    """Run blocking ``work`` on a daemon thread of ``threads`` (a call stuck on a dead worker
    must not keep the process alive; the engine's close joins it, bounded); its outcome
    resolves the returned future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            return  # the loop is gone

    threads.start(target, name="native-generation")
    return future
