"""``ChatRequest``: a checked chat request, as the orchestrator takes it.

The wire (``serve.chat_request``) parses and checks a request body into one; the pipeline
only reads it. It is also the interleaving controller's ``UMMRequest`` (``pipeline.umm``): the
route adds what admission measured (:meth:`ChatRequest.admitted`) and hands the same object on,
so no copy of the client's fields is made between the wire and the adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.errors import BadRequest

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
    """A checked chat request. ``sampling`` holds only the fields the client set; the dicts
    are the client's, by stage name, and ``messages`` is the client's conversation (chat media
    stay references, checked by the media policy). Read-only once the route admitted it."""

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
    #: The server's media policy (interleaved requests: the adapter checks generation media
    #: options with it); None where nothing checks media.
    media_policy: Any = None
    #: ``history_bytes(messages)`` when the caller measured it already (off the event loop).
    history_size: int | None = None
    #: Seconds the request waited before it reached this server (a fleet gateway's queue): its
    #: deadline (``timeout_s``) counts from its arrival there.
    waited_s: float = 0.0

    def admitted(self, rid: str, *, media_policy: Any = None, history_size: int | None = None,
                 waited_s: float = 0.0) -> ChatRequest:
        """This request with its claimed ``rid`` and what admission measured set (in place:
        the same object goes on to the controller as its ``UMMRequest``)."""
        self.rid = rid
        self.media_policy = media_policy
        self.history_size = history_size
        self.waited_s = waited_s
        return self


def check_stage_names(key: str, table: Iterable[str], stages: tuple[str, ...]) -> None:
    """BadRequest for the first stage name of ``table`` (``stage_params`` or
    ``stage_sampling``, named ``key``) that is not one of ``stages``: the one rule for unknown
    stage names, at the wire and in an adapter."""
    for stage in table:
        if stage not in stages:
            raise BadRequest(f"{key}.{stage}: no such stage; this pipeline has "
                             f"{', '.join(stages)}")


def sampling_layers(sampling: Mapping[str, Any], stage_sampling: Mapping[str, Mapping[str, Any]],
                    stage_params: Mapping[str, Mapping[str, Any]], stage: str = "reasoner"
                    ) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """The one home of sampling precedence: where a stage's sampling fields come from, lowest
    first (top level < ``stage_sampling.<stage>`` < ``stage_params.<stage>``), each with the
    path its fields are named by. A Reasoner payload carries the first two merged as
    ``sampling`` and the last as ``stage_params`` (``contract.payloads.reasoner_fields``)."""
    return (("", sampling), (f"stage_sampling.{stage}.", stage_sampling.get(stage, {})),
            (f"stage_params.{stage}.", stage_params.get(stage, {})))


def merged_sampling(layers: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """``layers`` (from :func:`sampling_layers`) merged, a later one winning."""
    merged: dict[str, Any] = {}
    for _, layer in layers:
        merged.update(layer)
    return merged
