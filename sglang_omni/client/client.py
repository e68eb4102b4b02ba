"""``Client``: the SDK for a running SGLang Omni server.

A top-level sampling field is sent only when the caller gives it a value other than its default,
as on the native chat stage. Closing an unfinished stream iterator closes the connection, which
aborts the request on the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from sglang_omni.client.direct import DirectGeneration
from sglang_omni.client.realtime import RealtimeClients
from sglang_omni.client.types import (
    OmniClientError,
    Segment,
    UMMCompletionResult,
    UMMGenerateChunk,
)
from sglang_omni.client.wire import raise_for

SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": None, "max_tokens": None,
    "stop": None,
}


class Client(DirectGeneration, RealtimeClients):
    """``Client(base_url="http://127.0.0.1:8000")``; usable as a context manager. The direct
    generation calls are :class:`~sglang_omni.client.direct.DirectGeneration`'s, the
    WebSocket sessions :class:`~sglang_omni.client.realtime.RealtimeClients`'."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *,
                 timeout: float | None = None, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._base_url = base_url.rstrip("/")
        self._headers = headers
        self._timeout = timeout
        self._http = httpx.Client(base_url=self._base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- interleaved -------------------------------------------------------------------------
    def completion(self, messages: list[dict[str, Any]], *, model: str | None = None,
                   stage_params: dict[str, Any] | None = None,
                   stage_sampling: dict[str, Any] | None = None,
                   images: list[str] | None = None, videos: list[str] | None = None,
                   rid: str | None = None, **sampling: Any) -> UMMCompletionResult:
        """An interleaved chat completion (``/v1/chat/completions``) with its segments."""
        body = self._body(model=model, messages=messages, stage_params=stage_params,
                          stage_sampling=stage_sampling, images=images, videos=videos,
                          rid=rid, sampling=sampling)
        resp = self._http.post("/v1/chat/completions", json=body)
        raise_for(resp)
        out = resp.json()
        choice = out["choices"][0]
        return UMMCompletionResult(
            id=out["id"], text=choice["message"].get("content") or "",
            segments=[Segment.from_wire(s) for s in choice["message"].get("segments", [])],
            finish_reason=choice.get("finish_reason") or "", usage=out.get("usage") or {})

    def generate(self, prompt: str | None = None, *,
                 messages: list[dict[str, Any]] | None = None, stream: bool = False,
                 stage_params: dict[str, Any] | None = None,
                 stage_sampling: dict[str, Any] | None = None, rid: str | None = None,
                 progress: bool = False, **sampling: Any) -> UMMCompletionResult | GenerateStream:
        """``/generate``: with ``stream=True`` an iterator of ``UMMGenerateChunk`` (close it to
        abort the request; ``progress=True`` adds ``progress`` chunks: each Reasoner turn and
        generation step), else the ``UMMCompletionResult``."""
        if progress and not stream:
            raise TypeError("progress=True needs stream=True (progress is streamed)")
        body = self._body(prompt=prompt, messages=messages, stage_params=stage_params,
                          stage_sampling=stage_sampling, rid=rid, sampling=sampling)
        if stream:
            body["stream"] = True
            if progress:
                body["include_progress"] = True
            return self._stream_generate(body)
        resp = self._http.post("/generate", json=body)
        raise_for(resp)
        out = resp.json()
        return UMMCompletionResult(
            id=out["execution_id"], text=out.get("text", ""),
            segments=[Segment.from_wire(s) for s in out.get("segments", [])],
            finish_reason=out.get("finish_reason", ""), usage=out.get("usage") or {})

    def _stream_generate(self, body: dict[str, Any]) -> GenerateStream:
        return GenerateStream(self._http, body)

    @staticmethod
    def _body(*, sampling: dict[str, Any], **fields: Any) -> dict[str, Any]:
        body = {k: v for k, v in fields.items() if v is not None}
        for key, value in sampling.items():
            if key not in SAMPLING_DEFAULTS:
                raise TypeError(f"unknown sampling field {key!r}; put native fields in "
                                "stage_params={'reasoner': {...}}")
            if value != SAMPLING_DEFAULTS[key]:
                body[key] = value
        return body


class GenerateStream(Iterator[UMMGenerateChunk]):
    """The chunks of a streamed ``/generate``. The request is sent at construction (a refusal
    raises there); ``close()`` before the end closes the connection, aborting the request."""

    def __init__(self, http: httpx.Client, body: dict[str, Any]) -> None:
        request = http.build_request("POST", "/generate", json=body)
        self._resp = http.send(request, stream=True)
        if self._resp.status_code != 200:
            self._resp.read()
            self._resp.close()
            raise_for(self._resp)
        self._events = self._parse()

    def __iter__(self) -> GenerateStream:
        return self

    def __next__(self) -> UMMGenerateChunk:
        try:
            return next(self._events)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _parse(self) -> Iterator[UMMGenerateChunk]:
        event = "message"
        for line in self._resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            payload = json.loads(data)
            if event == "segment":
                yield UMMGenerateChunk("segment", segment=Segment.from_wire(payload))
            elif event == "progress":
                yield UMMGenerateChunk("progress", progress=payload)
            elif event == "complete":
                yield UMMGenerateChunk(
                    "complete", finish_reason=payload.get("finish_reason"),
                    segments=[Segment.from_wire(s) for s in payload.get("segments", [])],
                    usage=payload.get("usage") or {})
            elif event == "error":
                raise OmniClientError(int(payload.get("code", 500)), str(payload.get("message")),
                                      str(payload.get("type")))
            event = "message"
