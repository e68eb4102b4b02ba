"""Whether the Cosmos3 guardrails run in a generation stage (every generator applies this rule).

They run when ``cosmos_guardrail`` is importable and :data:`GUARDRAILS_OFF_ENV` is not ``1``,
the rule native SGLang applies in each worker; the stage logs which is in force.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

#: ``1`` turns the Cosmos3 guardrails off.
GUARDRAILS_OFF_ENV = "SGLANG_DISABLE_COSMOS3_GUARDRAILS"


def guardrails_state(env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether Cosmos3 guardrails run, and a log line saying which and why."""
    if env.get(GUARDRAILS_OFF_ENV, "0") == "1":
        return False, (f"Cosmos3 guardrails are OFF: {GUARDRAILS_OFF_ENV}=1 turns them off "
                       "(NVIDIA's Open Model License expects a substitute)")
    if importlib.util.find_spec("cosmos_guardrail") is None:
        return False, ("Cosmos3 guardrails are OFF: the cosmos-guardrail package is not "
                       "installed (pip install cosmos-guardrail==0.3.1 turns them on)")
    return True, (f"Cosmos3 guardrails are ON (cosmos-guardrail is installed; "
                  f"{GUARDRAILS_OFF_ENV}=1 turns them off)")
