"""The hf Reasoner: transformers' Cosmos3 understanding tower behind the ``Engine`` interface.

It renders the conversation with the checkpoint's chat template and processor, and decodes with
``generate`` on one model thread. A ``response_format`` JSON schema (the adapter's decision
format) is enforced token by token (``constrained``), so decisions are valid JSON even from
random weights. Streaming emits ``{"text": delta}`` chunks as tokens arrive; an abort stops
decoding at the next token.

Decoding: on a GPU each token is one replay of a CUDA graph over a static KV cache
(``static_decode``, ``decode_loop``: the same processors, constraint and stopping rules as
``generate``); on the CPU, ``generate`` itself. On a GPU the engine warms up before it reports
ready: a short multimodal turn under a JSON schema (kernels, the llguidance vocabulary) and the
graphs of the first cache sizes.

Each request keeps a context in the stage (``context``): its media items' processor and vision
tower outputs and the K/V of its last turn, so a later turn of an interleaved request neither
reads, preprocesses nor encodes earlier media again and prefills only the tokens its prompt adds
(``prompt``). The context is released when the request ends (``end_request``) or is aborted,
and all contexts stay within ``stages.reasoner.factory.context_budget_bytes``.

Engine options (``stages.reasoner.engine``): ``dtype`` (auto: float32 on the CPU, bfloat16 on a
GPU), ``max_new_tokens`` (plain replies when the client sets no length, 1024),
``max_structured_tokens`` (the budget of a JSON-schema reply, 2048) and ``decoder`` (``auto``:
``graphs`` on a GPU, ``generate`` on the CPU; ``static``: the static cache without graphs).
"""

from __future__ import annotations

import os
import time
from typing import Any, cast

from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.payloads import ReasonerPayload, ReasonerResult, reasoner_fields
from sglang_omni.contract.result import StageResult
from sglang_omni.engines.base import check_checkpoint_folder
from sglang_omni.engines.hf.classes import model_class, processor_class
from sglang_omni.engines.hf.common import (
    JobCancelled,
    ModelThread,
    ThreadedModelEngine,
    engine_options,
    log,
    torch_device,
    torch_dtype,
)
from sglang_omni.engines.hf.constrained import (
    MIN_BUDGET,
    SchemaConstraint,
    Vocabulary,
    schema_of,
)
from sglang_omni.engines.hf.context import DEFAULT_BUDGET_BYTES, ContextStore, TurnKV
from sglang_omni.engines.hf.conversation import Conversation, MediaItem, read_conversation
from sglang_omni.engines.hf.decode_loop import static_generate, supports
from sglang_omni.engines.hf.prompt import build_prompt, prefill
from sglang_omni.engines.hf.static_decode import StaticDecoder
from sglang_omni.errors import BadRequest
from sglang_omni.media.settings import policy_from_spec

DEFAULTS: dict[str, Any] = {"dtype": "auto", "max_new_tokens": 1024,
                            "max_structured_tokens": 2048, "decoder": "auto"}
DECODERS = ("auto", "generate", "static", "graphs")
WARM_CACHE_SIZES = (1024, 2048, 4096, 8192)
TURN_SEED_STRIDE = 1_000_003
LENGTH_KEYS = ("max_tokens", "max_completion_tokens", "max_new_tokens")
PASSED = {"top_p": "top_p", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty"}
IGNORED = ("n", "stream_options", "user", "logprobs", "top_logprobs", "skip_special_tokens",
           "no_stop_trim")


class HFReasoner(ThreadedModelEngine):
    """``Cosmos3OmniForConditionalGeneration`` with its processor; one call at a time."""

    def __init__(self, spec: EngineSpec) -> None:
        check_checkpoint_folder(spec)
        self.spec = spec
        self.model_path = str(spec.model_path)
        self.options = engine_options(spec, DEFAULTS)
        if int(self.options["max_structured_tokens"]) < MIN_BUDGET:
            raise RuntimeError(f"stages.{spec.stage}.engine.max_structured_tokens: at least "
                               f"{MIN_BUDGET}")
        if self.options["decoder"] not in DECODERS:
            raise RuntimeError(f"stages.{spec.stage}.engine.decoder: "
                               f"{self.options['decoder']!r} is not one of {', '.join(DECODERS)}")
        self.policy = policy_from_spec(spec.media_policy)
        budget = spec.factory.get("context_budget_bytes")
        self.contexts = ContextStore(DEFAULT_BUDGET_BYTES if budget is None else int(budget))
        self.thread = ModelThread(spec)

    def end_request(self, rid: str) -> None:
        """The request ended (or was aborted): release its context."""
        freed = self.contexts.release(rid)
        if freed:
            held = self.contexts.stats()
            log.info("hf reasoner: request %s ended; released %d context bytes; contexts hold "
                     "%d bytes of %d requests", rid, freed, held["bytes"], held["requests"])

    def stats(self) -> dict[str, int]:
        """The context counters (``ContextStore.stats``), sent with the stage's heartbeats."""
        return self.contexts.stats()

    def _load(self) -> None:
        importing = time.perf_counter()
        processor, model = processor_class(self.model_path), model_class(self.model_path)

        started = time.perf_counter()
        self.device = torch_device(self.spec)
        dtype = torch_dtype(self.options["dtype"], self.device)
        self.processor = processor.from_pretrained(self.model_path)
        self.tokenizer = self.processor.tokenizer
        placement = {"device_map": str(self.device)} if self.device.type == "cuda" else {}
        self.model = model.from_pretrained(
            self.model_path, dtype=dtype, **placement).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if not self.eos_ids:
            self.eos_ids = [self.tokenizer.eos_token_id]
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self._vocab: Vocabulary | None = None
        mode = self.options["decoder"]
        if mode == "auto":
            mode = "graphs" if self.device.type == "cuda" else "generate"
        self.decoder = None if mode == "generate" else StaticDecoder(self.model, mode == "graphs")
        loaded = time.perf_counter() - started
        if self.device.type == "cuda":
            self._warm_up()
        self.parts = {"imports": started - importing, "weights": loaded,
                      "warm-up": time.perf_counter() - started - loaded}
        log.info("hf reasoner: %s loaded on %s (%s) in %.1f s, warmed up in %.1f s; imports "
                 "%.1f s; decoder %s; pid %d", self.spec.model_path, self.device, dtype, loaded,
                 time.perf_counter() - started - loaded, started - importing, mode, os.getpid())

    def _warm_up(self) -> None:
        """One short turn with an image under a JSON schema, then the decode graphs of the
        first cache sizes, so the first request does not pay for kernels and captures."""
        from PIL import Image

        conversation = Conversation(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi."}]}],
            media=[MediaItem("image", "warmup", value=Image.new("RGB", (64, 64), (128,) * 3))])
        schema = {"type": "object", "properties": {"a": {"type": "string"}},
                  "required": ["a"], "additionalProperties": False}
        settings = {"max_new_tokens": MIN_BUDGET, "logprobs": False, "top_logprobs": 0,
                    "stop": None, "seed": None}
        if self.decoder is not None:  # first: the graphs' cache holds the warm-up turn too
            self.decoder.capture(WARM_CACHE_SIZES)
        self._generate(Job("warmup", {}, [], emit=lambda _: None), conversation, schema,
                       settings)
        self.contexts.release("warmup")

    def _vocabulary(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = Vocabulary(self.tokenizer, self.vocab_size, self.eos_ids)
        return self._vocab

    async def run(self, job: Job) -> StageResult:
        payload = cast(ReasonerPayload, job.payload)
        schema = schema_of(payload.get("response_format"))
        settings = self._settings(reasoner_fields(payload), schema is not None)
        options = payload.get("options") or {}
        settings["logprobs"] = bool(options.get("logprobs"))
        settings["top_logprobs"] = int(options.get("top_logprobs") or 0)
        conversation = await read_conversation(job, self.policy)
        if payload.get("stream"):
            job.emit({"text": ""})  # accepted
        # An out-of-memory fails the request: its context goes with it (the turn's K/V was
        # taken out of the store; the media features it kept are released here), and the static
        # cache goes back to its size before the turn (a long prompt grows it before its
        # prefill runs out of memory: kept, the growth would fail the next request too).
        decoder = self.decoder
        capacity = decoder.capacity if decoder is not None else 0

        def release() -> None:
            self.end_request(job.rid)
            if decoder is not None:
                decoder.shrink(capacity)

        return await self.thread.call(self._generate, job, conversation, schema, settings,
                                      release=release)

    def _settings(self, merged: dict[str, Any], structured: bool) -> dict[str, Any]:
        """transformers ``generate`` arguments from the turn's merged sampling and native
        fields (``payloads.reasoner_fields``)."""
        out: dict[str, Any] = {"seed": None, "stop": None}
        limit = self.options["max_structured_tokens" if structured else "max_new_tokens"]
        for key, value in merged.items():
            if value is None or key in IGNORED:
                continue
            if key == "temperature":
                _number(key, value, 0)
                out["temperature"] = float(value)
            elif key == "top_k":
                _number(key, value, -1)
                if value >= 1:  # -1 and 0 mean no top-k cut, as in native SGLang
                    out["top_k"] = int(value)
            elif key in PASSED:
                _number(key, value, 0)
                out[PASSED[key]] = value
            elif key in ("presence_penalty", "frequency_penalty"):
                _number(key, value, -2)
                out[key] = float(value)
            elif key == "seed":
                out["seed"] = int(value)
            elif key in LENGTH_KEYS:
                if not structured:  # a decision's length is bounded by its format
                    _number(key, value, 1)
                    limit = int(value)
            elif key in ("min_tokens", "min_new_tokens"):
                if not structured:
                    out["min_new_tokens"] = int(value)
            elif key == "stop":
                if not structured:
                    out["stop"] = [value] if isinstance(value, str) else list(value)
            elif key == "stop_token_ids":
                if not structured:
                    out["stop_token_ids"] = [int(t) for t in value]
            elif key == "ignore_eos":
                if value and not structured:
                    out["ignore_eos"] = True
            else:
                raise BadRequest(f"{key}: not supported by the hf Reasoner backend; remove it")
        out["max_new_tokens"] = int(limit)
        return out

    def _generate(self, job: Job, conversation: Conversation, schema: dict[str, Any] | None,
                  settings: dict[str, Any]) -> StageResult:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        if job.cancelled.is_set():
            raise JobCancelled()
        before = self.contexts.stats()
        prepared = time.perf_counter()
        with torch.inference_mode():
            with job.timed("media"):  # reading, preprocessing and encoding the media
                prompt = build_prompt(self.processor, self.model, conversation, self.contexts,
                                      job.rid, job.cancelled)
                self._settle()
            with job.timed("prefill"):  # what the prompt adds to the kept K/V
                cache, reused = prefill(self.model, prompt, self.contexts.take_kv(job.rid))
                self._settle()
        prompt_len = prompt.length
        self.contexts.count_prefill(reused, prompt_len - reused)
        if job.cancelled.is_set():
            raise JobCancelled()
        max_new = settings["max_new_tokens"]
        processors: list[Any] = []
        constraint = None
        if schema is not None:
            vocab = self._vocabulary()
            constraint = SchemaConstraint(vocab, vocab.grammar(schema), prompt_len, max_new)
            processors.append(constraint)
        penalties = {k: settings[k] for k in ("presence_penalty", "frequency_penalty")
                     if settings.get(k)}
        if penalties:
            processors.insert(0, _Penalties(prompt_len, **penalties))

        class _Abort(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                job.progress()  # each decoded token: the engine is alive
                return torch.full((input_ids.shape[0],), job.cancelled.is_set(),
                                  dtype=torch.bool, device=input_ids.device)

        temperature = settings.get("temperature")
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "logits_processor": LogitsProcessorList(processors),
            "stopping_criteria": StoppingCriteriaList([_Abort()]),
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.model.generation_config.pad_token_id or self.eos_ids[0],
        }
        if temperature is not None:
            kwargs["do_sample"] = temperature > 0
            if temperature > 0:
                kwargs["temperature"] = temperature
        for key in ("top_p", "top_k", "min_p", "repetition_penalty", "min_new_tokens"):
            if key in settings:
                kwargs[key] = settings[key]
        if kwargs.get("do_sample") is False:
            for key in ("top_p", "top_k", "min_p"):
                kwargs.pop(key, None)
        if settings.get("stop"):
            kwargs["stop_strings"] = settings["stop"]
            kwargs["tokenizer"] = self.tokenizer
        if settings.get("stop_token_ids"):
            kwargs["eos_token_id"] = [*self.eos_ids, *settings["stop_token_ids"]]
        if settings.get("ignore_eos"):
            kwargs["min_new_tokens"] = max_new
        stream = _Stream(self.tokenizer, job) if job.payload.get("stream") else None
        if stream is not None:
            kwargs["streamer"] = stream
        if settings["logprobs"]:
            kwargs.update(return_dict_in_generate=True, output_logits=True)
        if settings.get("seed") is not None:
            # Each turn of a seeded request draws its own stream, reproducibly: the same seed
            # on every turn would make every decision the same draw.
            turn = int(job.payload.get("turn_index") or 0)
            torch.manual_seed(settings["seed"] + TURN_SEED_STRIDE * turn)
        started = time.perf_counter()
        decoder = self.decoder if supports(kwargs) else None
        fast = decoder is not None
        input_ids = prompt.ids.to(self.device)
        with torch.inference_mode(), job.timed("decode"):
            if decoder is not None:
                output = static_generate(decoder, {"input_ids": input_ids}, prefilled=cache,
                                         **kwargs)
            else:
                output = self.model.generate(input_ids=input_ids,
                                             attention_mask=torch.ones_like(input_ids),
                                             past_key_values=cache, **kwargs)
        if job.cancelled.is_set():
            raise JobCancelled()
        logits = None
        if settings["logprobs"]:
            output, logits = output.sequences, output.logits
        ids = output[0].tolist()
        with torch.inference_mode():
            if decoder is not None:
                cache = decoder.export(len(ids) - 1)
        held = cache.get_seq_length()  # all but the last token: generate never feeds it
        self.contexts.keep_kv(job.rid, TurnKV(ids[:held], prompt.media, cache), job.cancelled)
        new = ids[prompt_len:]
        ended = bool(new) and new[-1] in kwargs["eos_token_id"]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        if settings.get("stop"):
            text = _cut_at_stop(text, settings["stop"])
        if stream is not None:
            stream.flush(text)
        finish = "stop" if ended or len(new) < max_new else "length"
        if constraint is not None and not constraint.complete(ids):
            finish = "length"
        result: ReasonerResult = {
            "text": text, "finish_reason": finish,
            "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(new),
                      "total_tokens": prompt_len + len(new)},
        }
        if logits is not None:
            result["logprobs"] = self._logprobs(new, logits, settings["top_logprobs"])
        # The turn's time covers what generate covered before the context existed (vision
        # tower, prefill, decode) and now the media preparation: serve_gpu.py compares turns.
        self._log_turn(job, prompt_len, len(new), time.perf_counter() - prepared, fast)
        self._log_context(job, reused, prompt_len, started - prepared, before)
        return StageResult(result)

    def _settle(self) -> None:
        """Wait for the GPU's queued work, so a span's end is its work's end."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log_turn(self, job: Job, prompt_len: int, new: int, seconds: float,
                  fast: bool) -> None:
        """One line per turn (benchmarks/serve_gpu.py reads it): tokens, time, peak memory."""
        import torch

        peak = ""
        if self.device.type == "cuda":
            peak = f"; peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        log.info("hf reasoner: request %s: %d prompt + %d new tokens in %.3f s (%.1f tokens/s, "
                 "%s)%s", job.rid, prompt_len, new, seconds, new / max(seconds, 1e-9),
                 "static" if fast else "generate", peak)

    def _log_context(self, job: Job, reused: int, prompt_len: int, seconds: float,
                     before: dict[str, int]) -> None:
        """One line per turn on the request's context: what the turn reused and prefilled,
        its media hits and misses, and what all contexts hold against the budget."""
        now = self.contexts.stats()
        log.info("hf reasoner: request %s: context: %d of %d prompt tokens reused, %d "
                 "prefilled; media %d kept, %d encoded; prepared in %.3f s; contexts hold %d "
                 "of %d bytes (%d evictions)", job.rid, reused, prompt_len, prompt_len - reused,
                 now["hits"] - before["hits"], now["misses"] - before["misses"], seconds,
                 now["bytes"], now["budget"], now["evictions"])

    def _logprobs(self, new: list[int], logits: Any, top: int) -> dict[str, Any]:
        """OpenAI chat ``logprobs``: each generated token's log probability under the model's
        raw distribution, with the ``top`` most likely alternatives."""
        import torch

        def entry(token: int, value: float) -> dict[str, Any]:
            piece = self.tokenizer.decode([token])
            return {"token": piece, "logprob": value, "bytes": list(piece.encode())}

        content = []
        for token, step in zip(new, logits, strict=False):
            logp = torch.log_softmax(step[0].float(), dim=-1)
            item = entry(token, float(logp[token]))
            values, indices = torch.topk(logp, top) if top else (logp[:0], logp[:0])
            item["top_logprobs"] = [entry(int(i), float(v))
                                    for v, i in zip(values, indices, strict=True)]
            content.append(item)
        return {"content": content}


def _number(key: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise BadRequest(f"{key}: expected a number of at least {minimum}, got {value!r}")


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return text if cut < 0 else text[:cut]


class _Penalties:
    """OpenAI presence and frequency penalties over the tokens generated so far."""

    def __init__(self, prompt_len: int, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0) -> None:
        self.prompt_len = prompt_len
        self.presence = presence_penalty
        self.frequency = frequency_penalty

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        generated = input_ids[:, self.prompt_len:]
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


class _Stream:
    """A transformers streamer that emits text deltas, holding back split UTF-8 characters."""

    def __init__(self, tokenizer: Any, job: Job) -> None:
        self.tokenizer = tokenizer
        self.job = job
        self.ids: list[int] = []
        self.sent = ""
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # generate passes the prompt first
            self.prompt_seen = True
            return
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return
        self._emit(text)

    def end(self) -> None:
        return None

    def flush(self, final: str) -> None:
        """Send what the final text has beyond what was streamed (after stop trimming)."""
        if final.startswith(self.sent):
            self._emit(final)

    def _emit(self, text: str) -> None:
        delta = text[len(self.sent):]
        if delta:
            self.sent = text
            self.job.emit({"text": delta})
