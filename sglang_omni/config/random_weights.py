"""The note a checkpoint builder leaves in a checkpoint whose weights are random.

``sgl-omni make-checkpoint`` and ``make-tiny-checkpoint`` (and ``serve --demo``'s cached build)
write :data:`MARKER` at the checkpoint's root. A server whose ``model_path`` holds it says so: in
its ready line, in ``GET /server_info`` (``random_weights``, ``notice``) and on the playground
page, so nobody takes the noise images and gibberish answers of a random model for a bug.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: The file at a checkpoint's root that marks its weights as random.
MARKER = "sglang_omni_random_weights.json"


@dataclass(frozen=True)
class RandomWeights:
    """What the builder recorded: the command that builds such a checkpoint again."""

    built_by: str

    @property
    def notice(self) -> str:
        """One sentence for people: what to expect, that the pipeline is real, and where the
        checkpoint comes from (a server that makes images and videos)."""
        return self.notice_for(makes_media=True)

    def notice_for(self, *, makes_media: bool) -> str:
        """:attr:`notice` for a server that makes media, or one that only answers (text-only
        chat: it makes no image, so it says nothing of images)."""
        if not makes_media:
            return ("random weights: answers are gibberish, but the Reasoner runs the real "
                    f"model code (checkpoint built by {self.built_by})")
        return ("random weights: images are noise and answers are gibberish, but every stage "
                f"runs the real model code (checkpoint built by {self.built_by})")


def record(root: str | os.PathLike[str], built_by: str) -> None:
    """Mark the checkpoint at ``root`` as random-weight; ``built_by`` is the command that
    builds it (shown to users)."""
    body = {"random_weights": True, "built_by": built_by}
    (Path(root) / MARKER).write_text(json.dumps(body, indent=2) + "\n")


def read(model_path: str | os.PathLike[str] | None) -> RandomWeights | None:
    """The note of the checkpoint at ``model_path``, or None when it has none (a trained
    checkpoint, a hub id, no model at all). A marker that cannot be parsed still marks the
    weights as random: the file exists only in built checkpoints."""
    if model_path is None:
        return None
    marker = Path(model_path) / MARKER
    try:
        text = marker.read_text()
    except OSError:  # no such file, or model_path is no folder
        return None
    try:
        built_by = str(json.loads(text).get("built_by") or "")
    except (ValueError, AttributeError):
        built_by = ""
    return RandomWeights(built_by or "built by sgl-omni make-checkpoint")
