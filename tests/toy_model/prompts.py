"""What the toy adapter tells its Reasoner."""

from __future__ import annotations

INSTRUCTIONS = ("You are the toy model. Answer 'TOY-MAKE image: <prompt>' or 'TOY-MAKE video: "
                "<prompt>' to make media, or 'TOY-SAY: <answer>' to answer.")


def turn(generations_left: int) -> str:
    """The last message of every Reasoner turn."""
    return f"Toy turn: {generations_left} toy generation(s) left."


def generated(kind: str, number: int) -> str:
    return f"Toy {kind} {number} is above."
