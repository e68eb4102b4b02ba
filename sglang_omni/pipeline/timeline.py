"""Where a request's seconds went: one :class:`Timeline` per interleaved request.

Each dispatch adds its spans under its stage's name (``reasoner.prefill``, ``generation.denoise``,
...). The engine reports its own (``contract.job.ENGINE_SPANS``: media preparation, prefill,
decode, denoising, VAE decode, encoding: a video's MP4 is encoded while the VAE decodes its
frames, so its ``encode`` is the time from the last frame to the MP4's bytes, and the encoding
done before lies within ``vae_decode``); what its job took beyond them is ``<stage>.engine``
(an engine that reports no spans, like native's, is all ``engine``). The orchestrator adds
``<stage>.wait`` (waiting for the stage: the generation stage serves one request at a time) and
``<stage>.relay`` (the dispatch's time outside the stage's job: IPC, packing, the stage's own
queue). ``server`` is the rest of the request's wall time: admission, parsing, hashing and
delivering segments, and anything that ran outside a dispatch.

The request log line carries it as ``timeline=span:seconds,...``, progress events carry each
dispatch's spans (``spans``), and the metrics observe each span of each request
(``sgl_omni_request_span_seconds{span=...}``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sglang_omni.contract.job import ENGINE_SPANS

#: Spans the orchestrator adds to every dispatch, beside the engine's.
DISPATCH_SPANS = ("wait", "relay")
#: What a job took beyond the spans its engine reported.
ENGINE_REST = "engine"
#: The request's wall time outside its dispatches.
SERVER = "server"
#: The spans that are the model's own compute (the "model share" of benchmarks/serve_gpu.py).
MODEL_SPANS = ("prefill", "decode", "denoise", "vae_decode")
SPAN_NAMES = (*ENGINE_SPANS, ENGINE_REST, *DISPATCH_SPANS)


def dispatch_spans(engine_spans: Mapping[str, float], engine_s: float, wait_s: float,
                   dispatch_s: float) -> dict[str, float]:
    """One dispatch's spans: the engine's, ``engine`` for the rest of its ``engine_s``, ``wait``
    before the stage was this request's and ``relay`` for the dispatch's ``dispatch_s`` (from
    the stage being this request's to the result) outside the job."""
    spans = {name: engine_spans[name] for name in ENGINE_SPANS if name in engine_spans}
    spans[ENGINE_REST] = max(0.0, engine_s - sum(spans.values()))
    spans["wait"] = max(0.0, wait_s)
    spans["relay"] = max(0.0, dispatch_s - engine_s)
    return spans


class Timeline:
    """One request's seconds by ``stage.span``; see the module docstring."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}
        self.dispatched_s = 0.0

    def add(self, stage: str, spans: Mapping[str, float]) -> None:
        """Add one dispatch's spans (``dispatch_spans``) under ``stage``."""
        for name, seconds in spans.items():
            key = f"{stage}.{name}"
            self.spans[key] = self.spans.get(key, 0.0) + seconds
            self.dispatched_s += seconds

    def breakdown(self, wall_s: float) -> dict[str, float]:
        """Every span with seconds, then ``server``: ``wall_s`` less the dispatches' time."""
        found = {k: round(v, 3) for k, v in self.spans.items() if v > 0}
        found[SERVER] = round(max(0.0, wall_s - self.dispatched_s), 3)
        return found

    def model_s(self) -> float:
        """Seconds of the model's own compute (``MODEL_SPANS`` of every stage)."""
        return sum(v for k, v in self.spans.items() if k.rsplit(".", 1)[-1] in MODEL_SPANS)

