"""The hf Reasoner's decode step with a static KV cache, captured into CUDA graphs on a GPU.

transformers' eager ``generate`` launches every operation of every layer from Python for each
token, so at 8 B parameters it runs at the host's launch rate (12 to 30 tokens/s on an H200),
far under the GPU's. ``StaticDecoder`` keeps transformers for the prompt: ``prefill`` runs the
model's own forward (images, videos, deepstack features, 3D positions) and copies its K/V into
a preallocated cache. Each further token then runs ``step``: the same modules (norms,
projections, rotary embedding, MLPs, ``lm_head``) in the same order, with attention over the
cache masked to the positions written so far. On a GPU the step is captured into a CUDA graph
per cache length (powers of two from ``MIN_CACHE``; the graphs share one cache and one memory
pool), so a token costs one graph launch. On the CPU the step runs eagerly (``graphs=False``),
which is how the tests check it against ``generate``.

Only the language model is stepped here; decoding rules (processors, stopping, streaming) are in
``decode_loop``. One decoder serves one sequence at a time (batch of 1), on the model thread.
"""

from __future__ import annotations

import math
from typing import Any

from sglang_omni.engines.hf.common import log
from sglang_omni.engines.memory_faults import is_out_of_memory

MIN_CACHE = 1024


def cache_bucket(length: int) -> int:
    """The cache length a sequence of ``length`` tokens uses: a power of two, at least
    ``MIN_CACHE``."""
    return max(MIN_CACHE, 1 << max(0, math.ceil(math.log2(max(1, length)))))


def _norm(module: Any, x: Any) -> Any:
    """transformers' Qwen3-VL RMSNorm (statistics in float32, cast back, then the weight) as one
    fused ``rms_norm`` call: the same arithmetic in 2 kernels instead of 7, which matters in a
    step of a few thousand small kernels."""
    import torch.nn.functional as F

    return module.weight * F.rms_norm(x, (x.shape[-1],), eps=module.variance_epsilon)


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticDecoder:
    """Static-cache decoding of ``Cosmos3OmniForConditionalGeneration``'s language model.

    Contract: ``prefill(inputs, total)`` first (``total`` = prompt plus new tokens at most), then
    ``step(token, index)`` for index = prompt length, prompt length + 1, ... Each returns the
    float32 logits ``[1, vocab]`` of the last position; a graph's logits buffer is reused by the
    next ``step``, so copy what you keep. Call both under ``torch.inference_mode()`` (the cache
    is made of inference tensors).
    """

    def __init__(self, model: Any, graphs: bool) -> None:
        import torch

        self.model = model
        self.lm = model.model.language_model
        config = self.lm.config
        weight = self.lm.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.graphs = graphs and self.device.type == "cuda"
        self.layers = len(self.lm.layers)
        self.kv_heads = config.num_key_value_heads
        self.heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.capacity = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.captured: dict[int, tuple[Any, Any]] = {}
        self.pool: Any = None
        self.token = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self.index = torch.zeros(1, dtype=torch.long, device=self.device)
        self.delta = torch.zeros(1, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)

    # --- cache -----------------------------------------------------------------------------
    def reserve(self, total: int) -> None:
        """Make room for ``total`` tokens; growing the cache drops the captured graphs."""
        import torch

        size = cache_bucket(total)
        if size <= self.capacity:
            return
        self._drop()  # an allocation that fails below leaves an empty cache, not a short one
        shape = (1, self.kv_heads, size, self.head_dim)
        for _ in range(self.layers):
            self.keys.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
            self.values.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
        self.positions = torch.arange(size, device=self.device)
        self.capacity = size

    def shrink(self, capacity: int) -> None:
        """Give back the cache beyond ``capacity`` tokens (what a request that failed grew it
        by): the cache and its graphs are dropped and the cache made again at ``capacity``
        (graphs are captured again as steps need them)."""
        if self.capacity <= capacity:
            return
        self._drop()
        if capacity:
            self.reserve(capacity)

    def _drop(self) -> None:
        """Drop the cache; the graphs read its buffers: drop them, and their pool with them (a
        pool whose graphs are gone must not take new captures)."""
        import torch

        self.captured.clear()
        self.pool = None
        self.keys, self.values = [], []
        self.capacity = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- prompt ----------------------------------------------------------------------------
    def prefill(self, inputs: Any, total: int) -> Any:
        """Run the prompt through the model's own forward; keep its K/V; return the logits of
        its last position (float32, as ``generate`` takes them)."""
        import torch

        length = int(inputs["input_ids"].shape[1])
        self.reserve(total)
        self.model.model.rope_deltas = None  # stale deltas of an earlier multimodal prompt
        out = self.model(**inputs, use_cache=True, logits_to_keep=1)
        for i, layer in enumerate(out.past_key_values.layers):
            self.keys[i][:, :, :length].copy_(layer.keys)
            self.values[i][:, :, :length].copy_(layer.values)
        deltas = self.model.model.rope_deltas
        if deltas is None:
            self.delta.zero_()
        else:
            self.delta.copy_(deltas.reshape(-1)[:1].to(self.device))
        logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        del out
        return logits

    def resume(self, cache: Any, prompt: Any, total: int) -> Any:
        """Like ``prefill``, from a transformers ``DynamicCache`` that holds the K/V of all but
        the last token of ``prompt`` (``[1, n]``; the model's ``rope_deltas`` set for it, as
        ``prompt.prefill`` leaves them): copy it in, then step the last token."""
        length = int(prompt.shape[1])
        self.reserve(total)
        for i, layer in enumerate(cache.layers):
            self.keys[i][:, :, :length - 1].copy_(layer.keys)
            self.values[i][:, :, :length - 1].copy_(layer.values)
        deltas = self.model.model.rope_deltas
        if deltas is None:
            self.delta.zero_()
        else:
            self.delta.copy_(deltas.reshape(-1)[:1].to(self.device))
        return self.step(prompt[:, -1], length - 1).clone()

    def export(self, length: int) -> Any:
        """A ``DynamicCache`` with a copy of the K/V of the first ``length`` positions."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.layers):
            cache.update(self.keys[i][:, :, :length].clone(),
                         self.values[i][:, :, :length].clone(), i)
        return cache

    # --- one token -------------------------------------------------------------------------
    def step(self, token: Any, index: int) -> Any:
        """Feed ``token`` (a one-element tensor) at cache position ``index``."""
        if index >= self.capacity:
            raise RuntimeError(f"the static cache holds {self.capacity} tokens; call reserve")
        self.token.copy_(token.reshape(1, 1))
        self.index.fill_(index)
        length = cache_bucket(index + 1)
        if self.graphs:
            try:
                graph, logits = self._graph(length)
            except RuntimeError as exc:  # a capture failure leaves the eager step usable
                if is_out_of_memory(exc):  # this request fails; later ones keep the graphs
                    raise
                log.warning("hf reasoner: CUDA graph capture failed (%s); decoding without "
                            "graphs", exc)
                self.graphs = False
            else:
                graph.replay()
                return logits
        return self._forward(length)

    def capture(self, lengths: tuple[int, ...]) -> None:
        """Capture the graphs of these cache lengths now (at startup), growing the cache."""
        import torch

        if not self.graphs:
            return
        with torch.inference_mode():
            self.reserve(max(lengths))
            for length in lengths:
                self.index.fill_(0)
                try:
                    self._graph(cache_bucket(length))
                except RuntimeError as exc:
                    if is_out_of_memory(exc):
                        raise
                    log.warning("hf reasoner: CUDA graph capture failed (%s); decoding without "
                                "graphs", exc)
                    self.graphs = False
                    return

    def _graph(self, length: int) -> tuple[Any, Any]:
        import torch

        if length in self.captured:
            return self.captured[length]
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # Warm up on a side stream (cuBLAS handles and workspaces), then capture. Both write
        # the K/V of the current token at the current index, which the replay writes again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(length)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(length)
        self.captured[length] = (graph, logits)
        return graph, logits

    def _forward(self, length: int) -> Any:
        """The decode step over the first ``length`` cache positions; reads ``token``,
        ``index`` and ``delta`` from their buffers (graph-safe: no host synchronisation)."""
        import torch

        lm = self.lm
        hidden = lm.embed_tokens(self.token)
        # A generated token is text: its 3D position is its index plus the prompt's rope delta
        # on all three axes, as transformers computes it during generation.
        position = (self.index + self.delta).view(1, 1, 1).expand(3, 1, 1)
        cos, sin = lm.rotary_emb(hidden, position)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        visible = self.positions[:length] <= self.index
        bias = torch.zeros(length, dtype=torch.float32, device=self.device).masked_fill(
            ~visible, float("-inf"))
        group = self.heads // self.kv_heads
        for i, layer in enumerate(lm.layers):
            attn = layer.self_attn
            x = _norm(layer.input_layernorm, hidden)
            q = _norm(attn.q_norm, attn.q_proj(x).view(1, 1, -1, self.head_dim))
            k = _norm(attn.k_norm, attn.k_proj(x).view(1, 1, -1, self.head_dim))
            v = attn.v_proj(x).view(1, 1, -1, self.head_dim).transpose(1, 2)
            qk = torch.cat((q, k), dim=2).transpose(1, 2)  # one rotary pass for both
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk[:, :self.heads], qk[:, self.heads:]
            self.keys[i].index_copy_(2, self.index, k)
            self.values[i].index_copy_(2, self.index, v)
            keys = self.keys[i][:, :, :length]
            values = self.values[i][:, :, :length]
            # Query heads h = kv * group + g share K/V head kv (transformers' repeat_kv order).
            grouped = q.reshape(1, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * self.scaling + bias
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).reshape(1, 1, self.heads * self.head_dim)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(_norm(layer.post_attention_layernorm, hidden))
        hidden = _norm(lm.norm, hidden)
        return self.model.lm_head(hidden)[:, -1, :].float()
