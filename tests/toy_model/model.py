"""The toy model as the HTTP layer sees it: limits of its own."""

from __future__ import annotations

from typing import Any

from sglang_omni.contract.generation_limits import Defaults
from sglang_omni.contract.model import ServedModel


class ToyModel(ServedModel):
    """256x256 by default, no side over 512, and sides in multiples of 32 on every backend."""

    name = "Toy"
    defaults = Defaults(256, 256, 9, 8)
    action_defaults = defaults
    size_multiples = {"scripted": 32, "hf": 32, "native": 32}
    max_side = 512

    def generation_defaults(self, backend: Any) -> Defaults:
        return self.defaults  # its adapter sets them on every backend


TOY = ToyModel()
