"""``ToyUMMAdapter``: the toy model's interleaving, with its own one-line decision format
(``TOY-MAKE image: ...``, ``TOY-SAY: ...``) and prompts. One per request (see
``pipeline.umm.UMMAdapter``)."""

from __future__ import annotations

import copy
import re
from typing import Any

from sglang_omni.contract.generation_options import check_generation_options
from sglang_omni.contract.payloads import GenerationPayload, ReasonerPayload
from sglang_omni.contract.result import StageResult
from sglang_omni.errors import ServerError
from sglang_omni.pipeline.media_checks import check_generated_media
from sglang_omni.pipeline.umm import TEXT, Budget, Dispatch, Output, Step, UMMRequest
from tests.toy_model import prompts
from tests.toy_model.model import TOY

MAKE = re.compile(r"^TOY-MAKE (image|video): (.*)$", re.S)
SAY = "TOY-SAY:"


class ToyUMMAdapter:
    """The toy's turns: a Reasoner turn, then a generation it asks for, until it answers."""

    @staticmethod
    def render_decision(entry: dict[str, Any]) -> str:
        """A neutral script decision in the toy's format (for the scripted Reasoner)."""
        if entry.get("action") in ("image", "video"):
            return f"TOY-MAKE {entry['action']}: {entry.get('prompt', '')}"
        return f"{SAY} {entry.get('text', '')}"

    def start(self, request: UMMRequest, budget: Budget) -> Step:
        self.request = request
        self.options = check_generation_options(request.stage_params.get("generation"))
        self.options.setdefault("width", TOY.defaults.width)
        self.options.setdefault("height", TOY.defaults.height)
        self.turns: list[dict[str, Any]] = []
        self.frames: list[bytes | bytearray] = []
        self.generations = self.reasoner_turns = 0
        self.pending = ""
        return Step(dispatch=self._turn(budget))

    def advance(self, result: StageResult, budget: Budget) -> Step:
        if result.stage == "generation":
            data, mime = check_generated_media(self.pending, result.payload, result.frames)
            self.generations += 1
            self.frames.append(data)
            key = f"{self.pending}_url"
            self.turns.append({"role": "user", "content": [
                {"type": key, key: {"url": f"omni-frame://{len(self.frames) - 1}"}},
                {"type": "text", "text": prompts.generated(self.pending, self.generations)}]})
            return Step(outputs=(Output(self.pending, data=data, mime_type=mime),),
                        dispatch=self._turn(budget))
        text = str(result.payload.get("text", ""))
        if text.startswith(SAY):
            return Step(outputs=(Output(TEXT, text=text[len(SAY):].strip()),),
                        finish_reason="stop")
        made = MAKE.match(text)
        if made is None or budget.generations_left <= 0:
            raise ServerError(f"the toy Reasoner answered no toy decision: {text[:80]!r}")
        self.turns.append({"role": "assistant", "content": text})
        self.pending = made[1]
        payload: GenerationPayload = {"modality": made[1], "prompt": made[2],
                                      "options": copy.deepcopy(self.options)}
        return Step(dispatch=Dispatch("generation", payload, [], modality=made[1]))

    def _turn(self, budget: Budget) -> Dispatch:
        messages = [{"role": "system", "content": prompts.INSTRUCTIONS},
                    *copy.deepcopy(self.request.messages), *copy.deepcopy(self.turns),
                    {"role": "user", "content": prompts.turn(budget.offered_generations())}]
        self.reasoner_turns += 1
        payload: ReasonerPayload = {"messages": messages, "sampling": {"temperature": 0.0},
                                    "stage_params": {}, "stream": False,
                                    "turn_index": self.reasoner_turns - 1, "message_offset": 1}
        return Dispatch("reasoner", payload, list(self.frames))

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                "reasoner_turns": self.reasoner_turns, "generations": self.generations}

    def close(self) -> None:
        self.frames.clear()
        self.turns.clear()
