"""``Cosmos3UMMAdapter``: prompts, the decision format, media conversion and modality rules of
interleaved Cosmos3 requests. The controller drives it; it knows no transport."""

from __future__ import annotations

import copy
from typing import Any

from sglang_omni.contract.generation_options import (
    DEFAULT_VIDEO_FRAMES,
    MEDIA_OPTIONS,
    check_generation_options,
    modalities_for,
)
from sglang_omni.contract.payloads import GenerationPayload, ReasonerPayload
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import BadRequest, ServerError
from sglang_omni.media.content_parts import text_of
from sglang_omni.models.cosmos3 import decision, prompts
from sglang_omni.pipeline.chat_request import (
    LENGTH_STOP_FIELDS,
    NATIVE_LENGTH_STOP_FIELDS,
    SAMPLING_FIELDS,
    check_stage_names,
    sampling_layers,
)
from sglang_omni.pipeline.media_checks import check_generated_media
from sglang_omni.pipeline.umm import (
    IMAGE,
    TEXT,
    VIDEO,
    Budget,
    Dispatch,
    Output,
    Step,
    UMMRequest,
)

#: Length and stop settings, under both names, which decisions skip (pipeline.chat_request).
LENGTH_STOP_KEYS = LENGTH_STOP_FIELDS + NATIVE_LENGTH_STOP_FIELDS
REFUSED_REASONER_PARAMS = ("response_format", "json_schema", "regex", "ebnf", "tools",
                           "tool_choice", "messages", "stream", "n", "logprobs", "top_logprobs")


def set_per_decision(field: str) -> BadRequest:
    """The refusal of a field the interleaved pipeline sets itself for each decision (the
    decision format, tools, ...): the one home of that rule, at the top level and in the
    sampling layers."""
    return BadRequest(f"{field}: the interleaved pipeline sets this itself for each decision "
                      "(the Reasoner's decision format); remove it")


def decision_sampling(request: UMMRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sampling, other native fields) for every decision: greedy unless the client set a
    sampling field (top level < stage_sampling.reasoner < stage_params.reasoner); length and
    stop settings never apply."""
    sampling: dict[str, Any] = {"temperature": 0.0}
    extra: dict[str, Any] = {}
    layers = sampling_layers(request.sampling, request.stage_sampling, request.stage_params)
    for rank, (where, layer) in enumerate(layers):
        for key, value in layer.items():
            if key in LENGTH_STOP_KEYS:
                continue
            if key in REFUSED_REASONER_PARAMS:
                raise set_per_decision(f"{where}{key}")
            if key in SAMPLING_FIELDS:
                sampling[key] = value
            elif rank == len(layers) - 1:  # native fields: stage_params.reasoner
                extra[key] = value
            else:
                raise BadRequest(f"{where}{key}: not a sampling field; put other native fields "
                                 "under stage_params.reasoner")
    return sampling, extra


def with_budget(message: dict[str, Any], sentence: str) -> dict[str, Any]:
    """``message`` with a turn's budget sentence (``prompts.budget``) at the end of its content."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": f"\n\n{sentence}"}]}
    return {**message, "content": f"{content}\n\n{sentence}" if content else sentence}


class Cosmos3UMMAdapter:
    """One per request; see ``UMMAdapter`` for the contract."""

    render_decision = staticmethod(decision.render)  # used by the scripted Reasoner

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []  # assistant decision + the user reply to it
        self.frames: list[bytes | bytearray] = []
        self.generations = 0
        self.reasoner_turns = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.pending: decision.Decision | None = None
        self.opening_budget = ""  # the first turn's budget sentence, after the client's turn

    # --- contract ----------------------------------------------------------------------------
    def start(self, request: UMMRequest, budget: Budget) -> Step:
        self.request = request
        check_stage_names("stage_params", request.stage_params, ("reasoner", "generation"))
        if request.response_format is not None:
            raise set_per_decision("response_format")
        self.options = check_generation_options(request.stage_params.get("generation"))
        for key in MEDIA_OPTIONS:
            if key in self.options and request.media_policy is not None:
                request.media_policy.check(self.options[key],
                                           label=f"stage_params.generation.{key}")
        self.modalities = modalities_for(self.options)
        self.sampling, self.native_fields = decision_sampling(request)
        return Step(dispatch=self._reasoner_turn(budget))

    def advance(self, result: StageResult, budget: Budget) -> Step:
        if result.stage == "generation":
            return self._after_generation(result, budget)
        return self._after_decision(result, budget)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "reasoner_turns": self.reasoner_turns, "generations": self.generations}

    def close(self) -> None:
        self.frames.clear()
        self.turns.clear()

    # --- turns -------------------------------------------------------------------------------
    def _after_decision(self, result: StageResult, budget: Budget) -> Step:
        usage = result.payload.get("usage") or {}
        self.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.completion_tokens += int(usage.get("completion_tokens", 0))
        raw = str(result.payload.get("text", ""))
        made = decision.parse(raw)
        if made.action == "final":
            if not made.text.strip():
                return Step(finish_reason="stop")
            return Step(outputs=(Output(TEXT, text=made.text),), finish_reason="stop")
        self.turns.append({"role": "assistant", "content": raw})
        receipt = self._receipt_for(made, budget)
        if receipt is not None:
            self.turns.append({"role": "user", "content": receipt})
            return Step(dispatch=self._reasoner_turn(budget))
        self.pending = made
        options = copy.deepcopy(self.options)
        if made.action == VIDEO:
            options.setdefault("num_frames", DEFAULT_VIDEO_FRAMES)
        else:
            options.pop("num_frames", None)
        payload: GenerationPayload = {"modality": made.action, "prompt": made.text,
                                      "options": options}
        return Step(dispatch=Dispatch("generation", payload, [], modality=made.action))

    def _receipt_for(self, made: decision.Decision, budget: Budget) -> str | None:
        if not made.text.strip():
            return prompts.BLANK_PROMPT.format(kind=made.action)
        if made.action not in self.modalities:
            allowed = " and ".join(f"{m}s" for m in self.modalities)
            return prompts.MODALITY_REFUSED.format(allowed=allowed, kind=made.action)
        if budget.generations_left <= 0:
            return prompts.NO_GENERATIONS_LEFT.format(kind=made.action)
        if budget.planned_generations is not None and budget.planned_generations <= 0:
            return prompts.NO_TIME_LEFT.format(kind=made.action)
        return None

    def _after_generation(self, result: StageResult, budget: Budget) -> Step:
        made = self.pending
        if made is None:
            raise ServerError("a generation result arrived with no generation pending")
        self.pending = None
        if result.receipt is not None:  # the plan no longer allowed it: nothing was generated
            self.turns.append({"role": "user",
                               "content": prompts.NO_TIME_LEFT.format(kind=made.action)})
            return Step(dispatch=self._reasoner_turn(budget))
        data, mime = check_generated_media(made.action, result.payload, result.frames)
        output = Output(made.action, data=data, mime_type=mime)  # the bytes the Reasoner reads
        self.generations += 1
        self.frames.append(data)
        key = "image_url" if made.action == IMAGE else "video_url"
        self.turns.append({"role": "user", "content": [
            {"type": key, key: {"url": f"omni-frame://{len(self.frames) - 1}"}},
            {"type": "text", "text": prompts.generated(made.action, self.generations, made.text)},
        ]})
        return Step(outputs=(output,), dispatch=self._reasoner_turn(budget))

    def _reasoner_turn(self, budget: Budget) -> Dispatch:
        """The turn's conversation: the guide (the same on every turn), the client's messages,
        then the turns so far. The budget sentence ends the prompt, appended to its last user
        message, and stays there on later turns, so this turn's prompt extends the previous
        turn's prompt and reply token for token."""
        generations_left = budget.offered_generations()
        modalities = self.modalities if generations_left > 0 else ()
        sentence = prompts.budget(generations_left, modalities)
        if self.turns:  # it ends with the user message that answers the last decision
            self.turns[-1] = with_budget(self.turns[-1], sentence)
        else:
            self.opening_budget = sentence
        messages = copy.deepcopy(self.request.messages)
        if messages and messages[-1].get("role") == "user":
            messages[-1] = with_budget(messages[-1], self.opening_budget)
        else:
            messages.append({"role": "user", "content": self.opening_budget})
        guide = prompts.INSTRUCTIONS
        offset = 0  # messages put before the client's
        if messages and messages[0].get("role") == "system":
            first = messages[0]
            text = text_of(first["content"], sep=" ")
            messages[0] = {"role": "system", "content": f"{guide}\n\n{text}"}
        else:
            messages.insert(0, {"role": "system", "content": guide})
            offset = 1
        messages.extend(copy.deepcopy(self.turns))
        self.reasoner_turns += 1
        payload: ReasonerPayload = {
            "messages": messages,
            "sampling": dict(self.sampling),
            "stage_params": dict(self.native_fields),
            "response_format": decision.response_format(modalities),
            "stream": False,
            "turn_index": self.reasoner_turns - 1,
            "message_offset": offset,
        }
        return Dispatch("reasoner", payload, list(self.frames))
