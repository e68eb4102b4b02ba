"""The Cosmos3 Reasoner's decision format: a JSON object, requested with a JSON schema so native
SGLang decodes it constrained.

``{"decision": "generate_image" | "generate_video", "prompt": "..."}`` or
``{"decision": "final_answer", "answer": "..."}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang_omni.errors import ServerError

MAX_ANSWER_CHARS = 8192
MAX_PROMPT_CHARS = 4096
GENERATE = {"image": "generate_image", "video": "generate_video"}
FINAL = "final_answer"


@dataclass(frozen=True)
class Decision:
    """``action`` is ``image``, ``video`` or ``final``; ``text`` is the prompt or the answer."""

    action: str
    text: str


def decision_schema(modalities: tuple[str, ...]) -> dict[str, Any]:
    """The JSON schema of a decision; only ``final_answer`` when ``modalities`` is empty."""
    options: list[dict[str, Any]] = [{
        "type": "object",
        "properties": {"decision": {"const": FINAL}, "answer": {"type": "string"}},
        "required": ["decision", "answer"],
        "additionalProperties": False,
    }]
    for modality in modalities:
        options.append({
            "type": "object",
            "properties": {"decision": {"const": GENERATE[modality]},
                           "prompt": {"type": "string"}},
            "required": ["decision", "prompt"],
            "additionalProperties": False,
        })
    return options[0] if len(options) == 1 else {"anyOf": options}


def response_format(modalities: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {
        "name": "cosmos3_decision", "strict": True, "schema": decision_schema(modalities)}}


def render(entry: dict[str, Any]) -> str:
    """Serialize a neutral decision ``{"action", "prompt" | "text"}`` in this format."""
    action = entry.get("action")
    if action in GENERATE:
        body = {"decision": GENERATE[action], "prompt": str(entry.get("prompt", ""))}
    elif action == "final":
        body = {"decision": FINAL, "answer": str(entry.get("text", ""))}
    else:
        raise ValueError(f"script entry action must be image, video or final, got {action!r}")
    return json.dumps(body, ensure_ascii=False)


def parse(text: str) -> Decision:
    """Parse the Reasoner's raw output; ServerError when it is not a decision or too long."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServerError(f"the Reasoner's output is not a JSON decision ({exc}): "
                          f"{text[:200]!r}") from None
    if not isinstance(body, dict):
        raise ServerError(f"the Reasoner's decision is not a JSON object: {text[:200]!r}")
    kind = body.get("decision")
    if kind == FINAL and isinstance(body.get("answer"), str) and set(body) == {"decision",
                                                                                "answer"}:
        answer = body["answer"]
        if len(answer) > MAX_ANSWER_CHARS:
            raise ServerError(f"the Reasoner's answer has {len(answer)} characters, over the "
                              f"server limit of {MAX_ANSWER_CHARS}")
        return Decision("final", answer)
    for modality, name in GENERATE.items():
        if kind == name and isinstance(body.get("prompt"), str) and set(body) == {"decision",
                                                                                    "prompt"}:
            prompt = body["prompt"]
            if len(prompt) > MAX_PROMPT_CHARS:
                raise ServerError(f"the Reasoner's {modality} prompt has {len(prompt)} "
                                  f"characters, over the server limit of {MAX_PROMPT_CHARS}")
            return Decision(modality, prompt)
    raise ServerError(f"the Reasoner's output does not follow the decision format: "
                      f"{text[:200]!r}")
