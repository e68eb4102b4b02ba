"""The OpenAI chat wire shapes: completion bodies and stream chunks."""

from __future__ import annotations

import time
from typing import Any


def completion_body(rid: str, model: str, text: str, finish_reason: str,
                    usage: dict[str, Any] | None, **message_extra: Any) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, **message_extra},
            "finish_reason": finish_reason,
        }],
        "usage": usage,
    }


def chunk_body(rid: str, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body
