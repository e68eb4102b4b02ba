"""The scripted backend: deterministic engines for tests and the CPU quick start.

They run in the real stage processes behind the same ``Engine`` interface as the native
backends. The contract (documented in the README) is fixed; tests rely on it.

Reasoner: the first user message may hold ``<omni-script>JSON list</omni-script>``. Turn i
(``payload["turn_index"]``) answers with entry i: an object is a decision, serialized by the
pipeline's UMM adapter (``EngineSpec.umm_adapter``, given at stage start-up: a
``config.model_protocols.DecisionRenderer``); a string is
returned verbatim. ``delay_s`` simulates Reasoner time. In a ``text`` value ``{media}`` becomes
the JSON list of ``{"kind", "sha256"}`` of every image and video in the turn's conversation,
``{last}`` the text of the last message and ``{sampling}`` the sampling fields the turn
received. Past the script's end (or with no script) the answer is ``final`` with ``scripted
reasoner: no script entry for turn N``; without a script and without an adapter (text-only
chat) the reply is a short text derived from the input.
Additions: ``{stage_params}`` in a ``text`` value becomes the JSON of the native fields
(``stage_params``) the turn received; an entry ``{"error": {"status", "message"}}`` fails the turn
with that status, as native SGLang refuses a request; a streaming turn first sends an empty
chunk once it is accepted, as the native backend does. The Reasoner resolves the native server
arguments as the native backend does (``native.server_args``) and logs them, and answers a warmup
request before its stage reports ready unless ``engine.skip_server_warmup`` is set; with
``factory.native_lifecycle`` its stage behaves like a native one: the ``children`` stand in for
native SGLang's scheduler and detokenizer, one that exits stops the stage, and the stage's exit
stops the server.

Addition for liveness: an entry with ``"hang": true`` blocks the engine's thread for good (the
process lives and answers heartbeats: a hung GPU), and ``delay_s`` reports progress every
:data:`PROGRESS_SLICE_S`, as a decoding model does per token batch. Addition for GPU faults: an
entry with ``"oom": true`` fails the turn with the allocation error a real engine raises when its
GPU is full (:func:`simulated_out_of_memory`).

Generator: PNG (``DEFAULT_SIZE`` square, 640) or H.264 MP4 (``DEFAULT_VIDEO_FRAMES`` at
``DEFAULT_FPS``) whose pixels are a function of prompt, seed (``DEFAULT_SEED``), size and frame
index, after ``num_inference_steps`` (4) steps of ``factory.step_time_s`` seconds, cancellable
between steps. Either engine takes ``factory.start_delay_s`` seconds to start. Prompt
directives: ``!no-media``, ``!crash``, ``!oversize``, ``!extra``, ``!malformed``, ``!sleep=S``
(S silent seconds), ``!hang`` (blocks the engine's thread for good while the process lives, as a
hung GPU does), ``!error`` (the engine raises an unexpected exception: an engine bug),
``!oom`` (the engine raises the allocation error of a full GPU, as the real engines do),
and ``!size=N`` (media padded with trailing zeros to N bytes, for
benchmarks); anywhere in the prompt, ``!abort-delay=S`` makes an aborted generation take S more
seconds to end (as a native engine finishes its current step), and ``!encode-delay=S`` makes a
video's MP4 take S more seconds after its last frame (as a slow x264 would). A video's frames
are drawn one VAE-sized chunk at a time and encoded as they come (``engines.video_delivery``),
as the hf backend encodes its VAE's chunks. Between two steps the generator offers a step
boundary (``Job.step_boundary_async``, keeping :func:`scripted_latent_bytes`): on the stage an
older request's generation may pause it there and it resumes where it stopped, with the same
bytes (they depend on prompt, seed, size and frame index alone). Direct generation's actions
(``modality`` ``action``, the native action route's body in ``request``) are checked as the
native Cosmos3 action route checks them and answered with its response shape: ``action_horizon``
(16) rows of ``raw_action_dim`` (given, else 10) values derived from the task and seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import sys
import threading
from typing import Any, cast

import anyio
import psutil

from sglang_omni.config.model_protocols import DecisionRenderer
from sglang_omni.contract.actions import (
    action_envelope,
    action_fields,
    action_prompt,
    plan_action,
)
from sglang_omni.contract.encoding_settings import video_encoding
from sglang_omni.contract.generation_options import (
    DEFAULT_FPS,
    DEFAULT_SEED,
    DEFAULT_SIZE,
    DEFAULT_VIDEO_FRAMES,
)
from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.payloads import (
    ActionResult,
    GenerationPayload,
    MediaItem,
    MediaResult,
    ReasonerPayload,
    ReasonerResult,
)
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.native.lifecycle import ExitProbe, first_exit, psutil_probe
from sglang_omni.engines.native.server_args import WARMUP_PROMPT, resolve_server_args
from sglang_omni.engines.synth_media import frame_pixels
from sglang_omni.engines.video_delivery import StreamingMp4, encode_progress
from sglang_omni.errors import BadRequest, NativeRefusal, ServerError, is_error_status
from sglang_omni.media import MediaPolicy, RequestMediaDir
from sglang_omni.media.content_parts import iter_content_parts, text_of
from sglang_omni.media.encode import VideoEncoding, encode_png
from sglang_omni.media.gather import load_all
from sglang_omni.media.settings import policy_from_spec
from sglang_omni.media.types import INLINE_LIMIT

log = logging.getLogger("sglang_omni.scripted")

SCRIPT_RE = re.compile(r"<omni-script>(.*?)</omni-script>", re.DOTALL)
#: A scripted Reasoner's ``delay_s`` reports progress this often (simulated token batches).
PROGRESS_SLICE_S = 0.25


def hang_engine_thread(job: Job, directive: str) -> None:
    """Block the calling (engine) thread for good: the process lives and its reader thread
    answers heartbeats, but this engine never makes progress again (a hung GPU)."""
    log.error("request %s: %s directive, the engine thread hangs now", job.rid, directive)
    threading.Event().wait()


def simulated_out_of_memory(job: Job, directive: str) -> RuntimeError:
    """The allocation error a real engine raises when the GPU is full: ``torch.OutOfMemoryError``
    (a ``RuntimeError``) where torch is loaded in this process, else a ``RuntimeError`` with the
    same text; the stage answers either as it answers a real one (``engines.memory_faults``)."""
    message = (f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
               f"139.81 GiB of which 1.06 GiB is free. (scripted {directive}, request {job.rid})")
    log.error("request %s: %s directive, raising an out-of-memory error", job.rid, directive)
    torch = sys.modules.get("torch")
    oom_class = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom_class(message) if oom_class is not None else RuntimeError(message)


async def _reasoning_time(job: Job, seconds: float) -> None:
    """Simulated Reasoner time, reporting progress as decoding does."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        await asyncio.sleep(min(PROGRESS_SLICE_S, left))
        job.progress()


async def _start_delay(spec: EngineSpec) -> None:
    """``factory.start_delay_s``: simulate a model that takes that long to load."""
    delay = float(spec.factory.get("start_delay_s", 0) or 0)
    if delay > 0:
        log.info("starting: a simulated load of %g s (factory.start_delay_s)", delay)
        await asyncio.sleep(delay)


# --- Reasoner --------------------------------------------------------------------------------
def find_script(messages: list[dict[str, Any]]) -> list[Any] | None:
    """The script list of the first user message, or None; BadRequest if it is not a list."""
    first = next((m for m in messages if m.get("role") == "user"), None)
    if first is None:
        return None
    match = SCRIPT_RE.search(text_of(first.get("content")))
    if match is None:
        return None
    try:
        script = json.loads(match.group(1))
    except json.JSONDecodeError as exc:
        raise BadRequest(f"<omni-script> does not hold valid JSON: {exc}") from None
    if not isinstance(script, list):
        raise BadRequest("<omni-script> must hold a JSON list, one entry per Reasoner turn")
    return script


def media_parts(messages: list[dict[str, Any]], offset: int = 0) -> list[tuple[str, str, str]]:
    """(label, kind, url) of every image and video part of the conversation, in order (labels
    name the client's message indices: see ``ReasonerPayload.message_offset``)."""
    return [(part.label, part.kind, part.url or "")
            for part in iter_content_parts(messages, offset) if part.kind in ("image", "video")]


async def load_conversation_media(job: Job, policy: MediaPolicy) -> list[dict[str, str]]:
    """Read every image and video of the conversation as a native engine would, under the
    media policy (an interleaved request's items come as the job's frames, each sent to the
    stage once per request: ``pipeline.reasoner_media``); ``{"kind", "sha256"}`` of each, in
    order."""
    parts = media_parts(job.payload.get("messages", []),
                        int(job.payload.get("message_offset", 0)))
    with RequestMediaDir() as workdir:  # read a few at a time, within the request's deadline
        read = iter(await load_all([(label, url) for label, _, url in parts
                                    if job.frame_for(url) is None], policy, workdir))
        out = []
        for _, kind, url in parts:
            data = job.frame_for(url)
            data = next(read) if data is None else data
            digest = await anyio.to_thread.run_sync(_sha256, data) \
                if len(data) > OFF_LOOP_BYTES else _sha256(data)
            out.append({"kind": kind, "sha256": digest})
    return out


#: Media this large are hashed off the event loop.
OFF_LOOP_BYTES = 1024 * 1024


def _sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def _substitute(text: str, job: Job, media: list[dict[str, str]]) -> str:
    if "{media}" in text:
        text = text.replace("{media}", json.dumps(media))
    if "{last}" in text:
        messages = job.payload.get("messages", [])
        text = text.replace("{last}", text_of(messages[-1].get("content")) if messages else "")
    if "{sampling}" in text:
        text = text.replace("{sampling}", json.dumps(job.payload.get("sampling") or {},
                                                     sort_keys=True))
    if "{stage_params}" in text:
        text = text.replace("{stage_params}", json.dumps(job.payload.get("stage_params") or {},
                                                         sort_keys=True))
    return text


def _refusal(entry: dict[str, Any]) -> NativeRefusal:
    error = entry["error"] if isinstance(entry["error"], dict) else {}
    status = error.get("status", BadRequest.status)
    if isinstance(status, bool) or not isinstance(status, int) or not is_error_status(status):
        raise BadRequest("<omni-script> error entries need an HTTP status from 400 to 599")
    return NativeRefusal(str(error.get("message", "scripted refusal")), status)


class ScriptedReasoner:
    """Deterministic Reasoner; see the module docstring for the contract."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.adapter: DecisionRenderer | None = spec.umm_adapter
        self.policy = policy_from_spec(spec.media_policy)
        self.server_args = resolve_server_args(spec)
        self.stops_server_on_exit = bool(spec.factory.get("native_lifecycle"))
        self._children: dict[str, ExitProbe] = {}

    async def start(self) -> None:
        await _start_delay(self.spec)
        for warning in self.server_args.warnings:
            log.warning(warning)
        log.info("native server arguments (the scripted backend does not use them): %s",
                 json.dumps(self.server_args.kwargs, sort_keys=True, default=str))
        if self.stops_server_on_exit:
            self._children = {f"the scripted native child process {p.pid}": psutil_probe(p)
                              for p in psutil.Process().children()}
        if self.server_args.skip_warmup:
            log.info("warmup skipped (engine.skip_server_warmup)")
            return
        warmup = Job("warmup", {"messages": [{"role": "user", "content": WARMUP_PROMPT}]}, [],
                     emit=lambda _: None)
        answer = await self.run(warmup)
        log.info("warmup request answered before ready: %r", answer.payload["text"])

    async def watch(self) -> str:
        """With ``native_lifecycle``: complete when a ``children`` process exits."""
        if not self.stops_server_on_exit:
            await asyncio.Event().wait()
        return f"{await first_exit(self._children)} (scripted native_lifecycle)"

    async def close(self) -> None:
        return None

    async def run(self, job: Job) -> StageResult:
        payload = cast(ReasonerPayload, job.payload)
        media = await load_conversation_media(job, self.policy)
        messages = payload.get("messages", [])
        turn = int(payload.get("turn_index", 0))
        adapter = self.adapter
        script = find_script(messages)
        entry: Any
        if script is not None and turn < len(script):
            entry = script[turn]
        elif script is None and adapter is None:
            last = text_of(messages[-1].get("content")) if messages else ""
            entry = f"scripted reasoner: you said {last[:200]!r}"
        else:
            entry = {"action": "final",
                     "text": f"scripted reasoner: no script entry for turn {turn}"}
        if isinstance(entry, dict) and "error" in entry:
            raise _refusal(entry)
        if isinstance(entry, dict) and entry.get("hang") is True:
            hang_engine_thread(job, '"hang": true')
        if payload.get("stream"):
            job.emit({"text": ""})  # accepted
        if isinstance(entry, dict) and entry.get("oom") is True:  # after acceptance, as on hf
            raise simulated_out_of_memory(job, '"oom": true')
        if isinstance(entry, dict):
            entry = dict(entry)
            entry.pop("hang", None)
            entry.pop("oom", None)
            delay = float(entry.pop("delay_s", 0) or 0)
            if delay > 0:
                with job.timed("decode"):  # the simulated Reasoner time
                    await _reasoning_time(job, delay)
            for key in ("text", "prompt"):
                if isinstance(entry.get(key), str):
                    entry[key] = _substitute(entry[key], job, media)
            if adapter is not None:
                text = adapter.render_decision(entry)
            else:
                text = str(entry.get("text", entry.get("prompt", "")))
        else:
            text = str(entry)
        if payload.get("stream"):
            for piece in _pieces(text):
                job.emit({"text": piece})
                await asyncio.sleep(0)
        prompt_tokens = sum(len(text_of(m.get("content")).split()) for m in messages)
        completion_tokens = len(text.split())
        return StageResult(ReasonerResult(
            text=text, finish_reason="stop",
            usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                   "total_tokens": prompt_tokens + completion_tokens}))


def _pieces(text: str, size: int = 16) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


# --- Generator -------------------------------------------------------------------------------
DIRECTIVE_RE = re.compile(
    r"^\s*!(no-media|crash|oversize|extra|malformed|hang|error|oom|sleep=([0-9.]+)|size=([0-9]+))")
ABORT_DELAY_RE = re.compile(r"!abort-delay=([0-9.]+)")
ENCODE_DELAY_RE = re.compile(r"!encode-delay=([0-9.]+)")
#: Frames the scripted generator draws at a time after the first (Cosmos3's VAE: 4 frames for
#: each latent frame after the first, which gives 1).
VAE_CHUNK_FRAMES = 4


def _int_option(options: dict[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadRequest(f"stage_params.generation.{key}: expected a positive integer, "
                         f"got {value!r}")
    return int(value)


class ScriptedGenerator:
    """Deterministic generator producing real PNG/MP4 bytes; see the module docstring."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.step_time_s = float(spec.factory.get("step_time_s", 0) or 0)
        self.encoding = video_encoding(spec.factory)

    async def start(self) -> None:
        await _start_delay(self.spec)

    async def close(self) -> None:
        return None

    async def run(self, job: Job) -> StageResult:
        payload = cast(GenerationPayload, job.payload)
        modality = payload.get("modality", "image")
        prompt = str(payload.get("prompt", ""))
        options = dict(payload.get("options") or {})
        action: dict[str, Any] | None = None
        if modality == "action":
            action = action_fields(dict(payload.get("request") or {}))
            prompt = action_prompt(action)
            options = {"num_inference_steps": action.get("num_inference_steps"),
                       "seed": action.get("seed")}
        width = _int_option(options, "width", DEFAULT_SIZE)
        height = _int_option(options, "height", DEFAULT_SIZE)
        frames = _int_option(options, "num_frames", DEFAULT_VIDEO_FRAMES)
        fps = _int_option(options, "fps", DEFAULT_FPS)
        steps = _int_option(options, "num_inference_steps", 4)
        seed = int(options.get("seed", DEFAULT_SEED) or DEFAULT_SEED)
        directive = DIRECTIVE_RE.match(prompt)
        name = directive.group(1) if directive else None
        if name == "crash":
            log.error("request %s: !crash directive, exiting the stage process now", job.rid)
            os._exit(70)
        if name == "hang":
            hang_engine_thread(job, "!hang")
        if name == "oom":
            raise simulated_out_of_memory(job, "!oom")
        if name == "error":
            raise RuntimeError(f"request {job.rid}: !error directive (a simulated engine bug)")
        abort_delay = ABORT_DELAY_RE.search(prompt)
        try:
            if name and name.startswith("sleep="):
                await asyncio.sleep(float(name.removeprefix("sleep=")))
            with job.timed("denoise"):  # the simulated steps
                for step in range(steps):
                    try:
                        if self.step_time_s > 0:
                            await asyncio.sleep(self.step_time_s)
                        else:
                            await asyncio.sleep(0)
                    except asyncio.CancelledError:
                        log.info("request %s: generation cancelled at step %d of %d", job.rid,
                                 step, steps)
                        raise
                    job.emit({"step": step + 1, "steps": steps})
                    if step + 1 < steps:  # a step boundary: an older request's job may go first
                        await job.step_boundary_async(
                            scripted_latent_bytes(modality, width, height, frames), step + 1,
                            steps)
        except asyncio.CancelledError:
            if abort_delay:  # the abort ends after the step in progress, as on a native engine
                await asyncio.sleep(float(abort_delay.group(1)))
            raise
        if action is not None:
            if name == "no-media":
                raise ServerError("the native action generation failed (action policy returned "
                                  "no output; scripted directive !no-media)")
            return StageResult(ActionResult(
                action=scripted_action(job.rid, prompt, seed, steps, action)))
        if name == "no-media":
            reason = "scripted directive !no-media: the model ended without media (as native " \
                     "SGLang does on a guardrail block)"
            log.warning("request %s: generation produced no media: %s", job.rid, reason)
            return StageResult(MediaResult(media=[], reason=reason))
        if modality == "video":
            mime = "video/mp4"
            data = await self._video(job, prompt, seed, width, height, frames, fps,
                                     self.encoding.with_preset(options.get("x264_preset")))
        else:
            mime = "image/png"
            with job.timed("encode"):  # the pixels are made and encoded together
                data = await asyncio.to_thread(
                    lambda: encode_png(frame_pixels(prompt, seed, width, height, 0)))
        if name == "malformed":
            data = b"this is not a valid media file " * 8
        elif name == "oversize":
            data = data + b"\0" * (INLINE_LIMIT + 1 - len(data))
        elif name and name.startswith("size="):
            data = data + b"\0" * max(0, int(name.removeprefix("size=")) - len(data))
        items: list[MediaItem] = [{"kind": modality, "mime_type": mime, "frame": 0}]
        media_frames: list[bytes | bytearray] = [data]
        if name == "extra":
            items.append({"kind": modality, "mime_type": mime, "frame": 1})
            media_frames.append(data)
        return StageResult(MediaResult(media=items, reason=None), media_frames)

    async def _video(self, job: Job, prompt: str, seed: int, width: int, height: int,
                     frames: int, fps: int, encoding: VideoEncoding) -> bytes:
        """The video's MP4: its frames drawn one chunk at a time (1 frame, then 4 a chunk, as
        Cosmos3's causal VAE decodes them), each chunk encoded as soon as it is drawn."""
        progress = encode_progress(job)
        mp4 = StreamingMp4(job, width, height, fps, encoding)

        def draw() -> None:
            index = 0
            while index < frames:
                size = 1 if index == 0 else VAE_CHUNK_FRAMES
                chunk = []
                for at in range(index, min(frames, index + size)):
                    chunk.append(frame_pixels(prompt, seed, width, height, at))
                    progress()  # the simulated VAE decode, a frame at a time
                mp4.add(chunk)
                index += size

        try:
            await asyncio.to_thread(draw)
            mp4.finish()
            delay = ENCODE_DELAY_RE.search(prompt)
            if delay:  # a slow x264: the MP4 is done S seconds after its last frame
                log.info("request %s: %s: the MP4 takes %s s more", job.rid, delay.group(0),
                         delay.group(1))
                await asyncio.sleep(float(delay.group(1)))
            return await mp4.result()
        finally:
            mp4.abandon()  # a no-op once the MP4 is done


def scripted_latent_bytes(modality: str, width: int, height: int, frames: int) -> int:
    """The device bytes a paused scripted generation says it keeps: a float32 latent of 16
    channels at a sixteenth of the size, a latent frame per 4 video frames (as Cosmos3's)."""
    latent_frames = 1 + (frames - 1) // 4 if modality == "video" else 1
    return 16 * 4 * latent_frames * max(1, width // 16) * max(1, height // 16)


# --- Actions (direct generation) ---------------------------------------------------------------
ACTION_DOMAIN_IDS = {"droid_lerobot": 8}
SCRIPTED_RAW_ACTION_DIM = 10


def scripted_action(rid: str, prompt: str, seed: int, steps: int,
                    fields: dict[str, Any]) -> dict[str, Any]:
    """A deterministic action response in the native action route's envelope."""
    plan = plan_action(fields)
    dim = plan.raw_action_dim or SCRIPTED_RAW_ACTION_DIM
    domain_id = plan.domain_id if plan.domain_id is not None else \
        ACTION_DOMAIN_IDS.get(str(plan.domain_name), 0)
    digest = hashlib.sha256(f"{prompt}\x00{seed}".encode()).digest()
    values = [[round(digest[(r * dim + c) % len(digest)] / 127.5 - 1.0, 4) for c in range(dim)]
              for r in range(plan.horizon)]
    return action_envelope(rid, values, mode=plan.mode, domain_id=domain_id,
                           raw_action_dim=dim, steps=steps, model="scripted")
