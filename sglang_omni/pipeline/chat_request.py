"""``ChatRequest``: a checked chat request, as the orchestrator takes it.

The wire (``serve.chat_request``) parses and checks a request body into one; the pipeline
only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChatRequest:
    """A checked chat request. ``sampling`` holds only the fields the client set."""

    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    rid: Any = None
    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    stage_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
