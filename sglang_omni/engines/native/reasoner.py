"""The native Reasoner backend: a native SGLang ``Engine`` and its ``OpenAIServingChat``.

Every request goes through native SGLang's own chat service, so the chat template, multimodal
processing, sampling (fields a request leaves out come from the checkpoint's generation config)
and KV cache are native SGLang's. Omni adds, around each request:

* the media policy: media parts are checked, fetched or written to a temporary folder before
  native SGLang sees them (``reasoner_request.localize_media``); the request's own frames
  (``omni-frame://N``) are written once per request and reused by its later turns, their files
  removed when the request ends (``frame_files``);
* a fresh native request id per job, aborted at once when the job is cancelled (a cancelled
  request or a closed stream);
* native's HTTP statuses: a native refusal becomes an Omni error with the same status.

Lifecycle: ``start`` builds the engine with the resolved server arguments (``server_args``),
attaches native's request loop to the stage's event loop and sends the same warmup request as
``sglang serve`` (unless ``engine.skip_server_warmup``), so the stage reports ready only after
it. ``watch`` completes when a native scheduler or detokenizer process exits or signals a
failure (native children send their parent SIGQUIT), and the stage then stops, and with it the
server (``stops_server_on_exit``). Native processes die with the stage process: they carry
PR_SET_PDEATHSIG and share its process group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pydantic
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import ServerStatus

from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.payloads import ReasonerPayload, ReasonerResult
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.native.frame_files import FrameFiles, RequestFrameFiles
from sglang_omni.engines.native.lifecycle import ExitProbe, first_exit, process_probe
from sglang_omni.engines.native.reasoner_request import (
    StreamReader,
    chat_request_fields,
    completion_result,
    localize_media,
    new_native_rid,
    refusal_from_error_body,
)
from sglang_omni.engines.native.root_logging import kept_root_logging
from sglang_omni.engines.native.server_args import WARMUP_PROMPT, resolve_server_args
from sglang_omni.errors import BadRequest, NativeRefusal, ServerError
from sglang_omni.media import LazyMediaDir
from sglang_omni.media.settings import policy_from_spec

log = logging.getLogger("sglang_omni.native.reasoner")

EngineFactory = Callable[[dict[str, Any]], Any]

#: ``sglang serve``'s warmup (``http_server._execute_server_warmup``, 0.5.23): a multimodal
#: generation model gets a chat completion over a 32x32 black PNG; a text-only one (or one
#: started with ``language_model_only``) a ``/generate`` of ``WARMUP_PROMPT``. Both greedy,
#: 8 tokens.
WARMUP_MAX_TOKENS = 8
WARMUP_QUESTION = "Describe the image."
_TEXT_ONLY_FLAGS = ("language_only", "language_model_only", "skip_tokenizer_init")


def launch_engine(kwargs: dict[str, Any]) -> Any:
    """Start native SGLang (scheduler and detokenizer processes, tokenizer manager here)."""
    from sglang.srt.entrypoints.engine import Engine

    return Engine(**kwargs)


def warmup_image_base64() -> str:
    """The PNG ``sglang serve`` warms a multimodal model with."""
    from sglang.srt.entrypoints.http_server import MINIMUM_PNG_PICTURE_BASE64

    return MINIMUM_PNG_PICTURE_BASE64


class NativeReasoner:
    """The Reasoner stage engine of the ``native`` backend (see the module docstring)."""

    stops_server_on_exit = True

    def __init__(self, spec: EngineSpec, engine_factory: EngineFactory = launch_engine) -> None:
        self.spec = spec
        self.args = resolve_server_args(spec)
        self.policy = replace(policy_from_spec(spec.media_policy),
                              max_file_size_mb=self.args.media_url_max_file_size_mb)
        self._engine_factory = engine_factory
        self._children: dict[str, ExitProbe] = {}
        self._failure_signal = asyncio.Event()
        self.engine: Any = None
        self.chat: OpenAIServingChat | None = None
        self.frame_files = RequestFrameFiles()

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        for warning in self.args.warnings:
            log.warning(warning)
        before = set(multiprocessing.active_children())
        with kept_root_logging():  # native's configure_logger replaces the root handlers
            self.engine = self._engine_factory(dict(self.args.kwargs))
        self._children = self._native_children(before)
        manager = self.engine.tokenizer_manager
        self.chat = OpenAIServingChat(manager, self.engine.template_manager)
        self.known_fields = frozenset(ChatCompletionRequest.model_fields)
        # Attach native's receive loop to this loop now (it installs signal handlers when it
        # does), then take SIGQUIT: a failing native child sends it to its parent.
        manager.auto_create_handle_loop()
        if threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT,
                                                          self._failure_signal.set)
        if self.args.skip_warmup:
            log.info("native warmup skipped (engine.skip_server_warmup)")
        else:
            await self._warmup()
        manager.server_status = ServerStatus.Up
        log.info("native SGLang ready: %s", ", ".join(self._children) or "no child processes")

    def _native_children(self, before: set[multiprocessing.process.BaseProcess]
                         ) -> dict[str, ExitProbe]:
        schedulers = set(self.engine.get_all_child_pids())
        children = {}
        for proc in multiprocessing.active_children():
            if proc in before:
                continue
            role = "scheduler" if proc.pid in schedulers else "detokenizer"
            children[f"the native SGLang {role} process {proc.pid}"] = process_probe(proc)
        return children

    async def watch(self) -> str:
        """Complete with a message once a native child process exits or signals a failure."""
        reason = await first_exit(self._children, wake=self._failure_signal)
        return f"{reason}; native SGLang cannot serve without it"

    async def close(self) -> None:
        self.frame_files.close()
        if self.engine is not None:
            self.engine.shutdown()

    def end_request(self, rid: str) -> None:
        """Request ``rid`` ended (or was aborted, or failed): its frame files go (once its
        running job, if any, has ended)."""
        self.frame_files.end(rid)

    async def _warmup(self) -> None:
        manager = self.engine.tokenizer_manager
        server_args = self.engine.server_args
        multimodal = (manager.model_config.is_image_understandable_model
                      and not any(getattr(server_args, f, False) for f in _TEXT_ONLY_FLAGS))
        log.info("sending the native warmup request (%s)",
                 "chat completion with an image" if multimodal else "text generation")
        assert self.chat is not None, "start() first"
        if multimodal:
            request = ChatCompletionRequest(
                model=manager.served_model_name, stream=False, temperature=0.0,
                max_tokens=WARMUP_MAX_TOKENS,
                messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {
                        "url": f"data:image/png;base64,{warmup_image_base64()}"}},
                    {"type": "text", "text": WARMUP_QUESTION}]}])
            response = await self.chat.handle_request(request, None)
            status = getattr(response, "status_code", 200)
            if status != 200:
                raise RuntimeError(f"the native warmup request failed ({status}): "
                                   f"{bytes(response.body).decode(errors='replace')}")
        else:
            obj = GenerateReqInput(text=WARMUP_PROMPT, sampling_params={
                "temperature": 0, "max_new_tokens": WARMUP_MAX_TOKENS})
            async for _ in manager.generate_request(obj, None):
                pass

    # --- requests -------------------------------------------------------------------------------
    async def run(self, job: Job) -> StageResult:
        assert self.chat is not None, "start() first"
        payload = cast(ReasonerPayload, job.payload)
        native_rid = new_native_rid()
        log.debug("request %s runs as native request %s", job.rid, native_rid)
        frame_files = self.frame_files.open(job.rid)
        try:
            return await self._run(job, payload, native_rid, frame_files)
        finally:
            self.frame_files.done(job.rid, frame_files)

    async def _run(self, job: Job, payload: ReasonerPayload, native_rid: str,
                   frame_files: FrameFiles) -> StageResult:
        with LazyMediaDir() as workdir:  # a turn reading only its frames writes none
            messages = await localize_media(payload.get("messages") or [], job.frames,
                                            self.policy, workdir,
                                            int(payload.get("message_offset", 0)),
                                            frame_files)
            fields = chat_request_fields(payload, messages, native_rid, self.known_fields,
                                         self.spec.stage)
            try:
                request = ChatCompletionRequest.model_validate(fields)
            except pydantic.ValidationError as exc:
                raise BadRequest(_validation_message(exc, self.spec.stage)) from None
            try:
                return StageResult(await self._complete(request, job))
            except BaseException:
                # Cancelled (client gone, stream closed) or failed: stop native work now.
                self.engine.tokenizer_manager.abort_request(native_rid)
                raise

    async def _complete(self, request: ChatCompletionRequest, job: Job) -> ReasonerResult:
        assert self.chat is not None, "start() first"
        response = await self.chat.handle_request(request, None)
        body_iterator = getattr(response, "body_iterator", None)
        if body_iterator is not None:  # a StreamingResponse: consume native's SSE here
            reader = StreamReader(job.emit)
            try:
                async for item in body_iterator:
                    reader.feed(item)
            finally:
                await body_iterator.aclose()
            return reader.result()
        status = getattr(response, "status_code", None)
        if status is not None:  # an error response (ORJSONResponse)
            try:
                body = json.loads(bytes(response.body))
            except ValueError:
                body = {"message": bytes(response.body).decode(errors="replace")}
            raise refusal_from_error_body(status, body)
        result = completion_result(response.model_dump(mode="json"))
        if request.stream:
            raise NativeRefusal("native SGLang answered a streaming request without a "
                                "stream", ServerError.status)
        return result


def _validation_message(exc: pydantic.ValidationError, stage: str) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return (f"native SGLang refused the request (fields under stage_params.{stage} and the "
            f"sampling fields): {'; '.join(problems)}")
