"""The premise of the concurrency and resource tests, checked with the real planner: under
``ROOMY`` a server admits every request its clients send, however many of them are still
planned, at the generation and turn times a loaded machine measures (no Ray, no server)."""

from __future__ import annotations

import pytest

from sglang_omni.pipeline.planner import Admit, GenerationFinished, TurnEnded
from tests.planner.kit import make
from tests.reliability.kit import ROOMY

MAX_GENERATIONS = 8  # the orchestrator's default cap, which the ROOMY servers keep
#: The longest 1-step generation and Reasoner turn a full run beside two CPU burners measured
#: (seconds, rounded up), and more.
LOADED_S = (5.0, 10.0, 20.0)


def option(name: str) -> float:
    return float(ROOMY[ROOMY.index(f"--orchestrator.factory.{name}") + 1])


def admits_all(timeout_s: float, active: int, seconds: float) -> bool:
    """Whether ``active`` requests and one more, arriving at once (each planned from its first
    turn; aborted ones count until their jobs end), are all admitted with every generation."""
    planner, _ = make(timeout_s, max_generations=MAX_GENERATIONS)
    planner.handle(TurnEnded("warm-up", seconds))
    planner.handle(GenerationFinished("warm-up", "image", seconds, steps=1))
    for i in range(active + 1):
        if planner.handle(Admit(f"r{i}")).refused is not None \
                or planner.allowance(f"r{i}") < MAX_GENERATIONS:
            return False
    return True


@pytest.mark.parametrize("seconds", LOADED_S)
def test_roomy_admits_a_request_behind_max_active_others(seconds: float) -> None:
    active = int(option("max_active")) - 1
    assert admits_all(option("timeout_s"), active, seconds)


def test_an_hour_refused_what_a_loaded_run_had_planned() -> None:
    """The resource test's failure beside two burners: 80 planned aborted streams at 5 s a
    generation and turn filled a 3600 s plan (ROOMY's timeout_s then)."""
    assert not admits_all(3600.0, 80, LOADED_S[0])
