"""What the Cosmos3 adapter tells the Reasoner: instructions and receipts."""

from __future__ import annotations

INSTRUCTIONS = """\
You can create images and videos and look at them before you answer. Each turn, reply with one \
JSON decision:
- {"decision": "generate_image", "prompt": "..."} to create an image,
- {"decision": "generate_video", "prompt": "..."} to create a video,
- {"decision": "final_answer", "answer": "..."} to answer the user.
Every image and video you create is shown to you in the next turn. The message before each \
of your turns ends with what you may still create and how many generations are left."""


def budget(generations_left: int, modalities: tuple[str, ...]) -> str:
    """A turn's budget sentence. It ends the turn's prompt and stays in the conversation after
    it; :data:`INSTRUCTIONS` is the same on every turn, so each turn's prompt extends the one
    before it token for token (a prefix cache reuses it)."""
    if generations_left <= 0 or not modalities:
        return "No generations are left: give the final answer now."
    kinds = " and ".join(f"{m}s" for m in modalities)
    return f"You may create {kinds}; {generations_left} generation(s) left."


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
