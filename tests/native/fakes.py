"""Fakes for the native tier: a native ``Engine`` stand-in whose tokenizer manager and template
manager are small strict classes, under which the real ``OpenAIServingChat`` runs on the CPU
(the recipe of sglang's own CPU tests of the chat service).

The tokenizer manager answers by the rendered prompt: ``SLOW`` streams until aborted,
``QUEUE-FULL`` is refused as native's scheduler refuses a request beyond its queue, anything
else answers ``hi there``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any

import fastapi

GENERATION_CONFIG = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}


class FakeTokenizer:
    chat_template = None
    bos_token_id = None
    eos_token_id = 0

    def encode(self, text: str, **_: Any) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True,
                            **_: Any) -> Any:
        def text(content: Any) -> str:
            if isinstance(content, list):
                return " ".join(p.get("text", f"<{p.get('type')}>") for p in content)
            return str(content)

        prompt = "\n".join(f"{m['role']}: {text(m.get('content'))}" for m in messages)
        return self.encode(prompt) if tokenize else prompt


class FakeTemplates:
    chat_template_name = None
    jinja_template_content_format = "openai"
    jinja_template_may_reorder_tool_results = False
    python_chat_template = None
    reasoning_config = None


def _meta(rid: str, completion_tokens: int, finish: dict | None) -> dict:
    return {"id": rid, "prompt_tokens": 5, "completion_tokens": completion_tokens,
            "cached_tokens": 0, "weight_version": "fake", "finish_reason": finish}


class FakeTokenizerManager:
    """What ``OpenAIServingChat`` and ``NativeReasoner`` touch of native's tokenizer manager."""

    def __init__(self, multimodal: bool = True) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_config = SimpleNamespace(
            is_multimodal=multimodal, is_image_understandable_model=multimodal,
            hf_config=SimpleNamespace(architectures=["Cosmos3ForConditionalGeneration"],
                                      model_type="cosmos3_omni"),
            get_default_sampling_params=lambda: dict(GENERATION_CONFIG))
        self.server_args = SimpleNamespace()
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
        self.served_model_name = "cosmos3"
        self.server_status: Any = "Starting"
        self.loop_attached = 0
        self.requests: list[Any] = []  # every GenerateReqInput, in order
        self.aborted: list[str] = []  # rids given to abort_request
        self.cancelled: list[str] = []  # rids whose generation was cancelled or closed
        self.started = asyncio.Event()

    def config_value(self, name: str) -> Any:
        return None

    def auto_create_handle_loop(self) -> None:
        self.loop_attached += 1

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)

    def create_abort_task(self, obj: Any) -> None:
        return None

    async def generate_request(self, obj: Any, request: Any = None):  # noqa: ANN201
        obj.normalize_batch_and_arguments()  # as native's does: gives a warmup its rid
        self.requests.append(obj)
        prompt = obj.text if isinstance(obj.text, str) else self.tokenizer.decode(obj.input_ids)
        try:
            if "QUEUE-FULL" in prompt:
                message = "The request queue is full."
                if not obj.stream:
                    raise fastapi.HTTPException(status_code=503, detail=message)
                yield {"text": "", "index": 0, "meta_info": _meta(obj.rid, 0, {
                    "type": "abort", "status_code": HTTPStatus.SERVICE_UNAVAILABLE,
                    "message": message})}
                return
            if "SLOW" in prompt:
                self.started.set()
                if obj.stream:
                    yield {"text": "wait", "index": 0, "meta_info": _meta(obj.rid, 1, None)}
                await asyncio.sleep(3600)
            pieces = ["hi", "hi there"]  # cumulative, as native streams text
            if obj.stream:
                for i, text in enumerate(pieces):
                    finish = {"type": "stop", "matched": None} if i == len(pieces) - 1 else None
                    yield {"text": text, "index": 0, "meta_info": _meta(obj.rid, i + 1, finish)}
                    await asyncio.sleep(0)
            else:
                meta = _meta(obj.rid, 2, {"type": "stop", "matched": None})
                if obj.return_logprob:
                    meta["output_token_logprobs"] = [(-0.1, 104, "hi"), (-0.2, 116, " there")]
                    meta["output_top_logprobs"] = [[(-0.1, 104, "hi")], [(-0.2, 116, " there")]]
                yield {"text": pieces[-1], "index": 0, "meta_info": meta}
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(obj.rid)
            raise


def _idle() -> None:
    while True:
        time.sleep(3600)


class FakeEngine:
    """Stands in for ``sglang.Engine``: the kwargs it got, the managers, child processes."""

    def __init__(self, kwargs: dict[str, Any], multimodal: bool = True,
                 children: int = 0) -> None:
        self.kwargs = kwargs
        self.server_args = SimpleNamespace(**kwargs)
        self.tokenizer_manager = FakeTokenizerManager(multimodal)
        self.template_manager = FakeTemplates()
        ctx = multiprocessing.get_context("spawn")
        self.children = [ctx.Process(target=_idle, daemon=True) for _ in range(children)]
        for child in self.children:
            child.start()
        self.shut_down = False

    def get_all_child_pids(self) -> list[int]:
        return [c.pid for c in self.children[:1]]  # the first one plays the scheduler

    def shutdown(self) -> None:
        self.shut_down = True
        for child in self.children:
            if child.is_alive():
                child.kill()
            child.join(5)
