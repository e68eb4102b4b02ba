"""``ChatRequest``: a checked chat request, as the orchestrator takes it.

The wire (``serve.chat_request``) parses and checks a request body into one; the pipeline
only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Sampling fields. The chat route passes them to native SGLang; in an interleaved request one
#: the client sets applies to every decision (top level < stage_sampling.reasoner <
#: stage_params.reasoner).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "seed")
#: Length and stop settings under native chat request names (top-level fields of the chat
#: route). They never apply to interleaved decisions: the decision format bounds their length.
LENGTH_STOP_FIELDS = ("max_tokens", "max_completion_tokens", "stop", "stop_token_ids",
                      "min_tokens", "ignore_eos", "no_stop_trim")
#: The same settings under native ``SamplingParams`` names, which stage_sampling may use.
NATIVE_LENGTH_STOP_FIELDS = ("max_new_tokens", "min_new_tokens", "stop_regex")
#: Output settings the chat route takes at the top level beside sampling, length and stop. Not
#: a sampling field of a decision: an interleaved request sets them only in
#: stage_params.reasoner.
OUTPUT_FIELDS = ("skip_special_tokens",)


@dataclass
class ChatRequest:
    """A checked chat request. ``sampling`` holds only the fields the client set."""

    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    #: Interleaved streams only: send progress events (``stream_options.include_progress``).
    include_progress: bool = False
    rid: Any = None
    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    stage_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
