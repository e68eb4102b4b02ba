"""What the Cosmos3 adapter tells the Reasoner: instructions and receipts."""

from __future__ import annotations

INSTRUCTIONS = """\
You can create images and videos and look at them before you answer. Each turn, reply with one \
JSON decision:
- {{"decision": "generate_image", "prompt": "..."}} to create an image,
- {{"decision": "generate_video", "prompt": "..."}} to create a video,
- {{"decision": "final_answer", "answer": "..."}} to answer the user.
Every image and video you create is shown to you in the next turn. {budget}"""


def instructions(generations_left: int, modalities: tuple[str, ...]) -> str:
    if generations_left <= 0 or not modalities:
        budget = "No generations are left: give the final answer now."
    else:
        kinds = " and ".join(f"{m}s" for m in modalities)
        budget = f"You may create {kinds}; {generations_left} generation(s) left."
    return INSTRUCTIONS.format(budget=budget)


def generated(kind: str, number: int, prompt: str) -> str:
    return f"Generated {kind} {number}, from the prompt: {prompt}"


BLANK_PROMPT = ("Receipt: the {kind} prompt was blank, so nothing was generated. Decide again: "
                "give a non-empty prompt or the final answer.")
NO_TIME_LEFT = ("Receipt: no time is left for another generation, so the {kind} was not "
                "generated. Give the final answer now.")
NO_GENERATIONS_LEFT = ("Receipt: no more generations fit in this request, so the {kind} was "
                       "not generated. Give the final answer now.")
MODALITY_REFUSED = ("Receipt: only {allowed} may be generated for this request, so the {kind} "
                    "was not generated. Decide again.")
