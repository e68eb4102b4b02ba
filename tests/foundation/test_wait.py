"""``aio.wait.wait_set``, the one timed event wait, and the rule that makes it the one: no module
calls ``asyncio.wait_for``, whose Python 3.11 form swallows a cancellation that lands in the step
its inner wait completes (an aborted stage job ran its whole generation that way)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from sglang_omni.aio.wait import wait_set

PACKAGE = Path(__file__).parents[2] / "sglang_omni"


def test_wait_set_says_whether_the_event_was_set_in_time() -> None:
    async def scenario() -> tuple[bool, bool]:
        event = asyncio.Event()
        late = await wait_set(event, 0.01)
        asyncio.get_running_loop().call_soon(event.set)
        return late, await wait_set(event, 5)

    assert asyncio.run(scenario()) == (False, True)


def test_a_cancellation_landing_with_the_event_always_propagates() -> None:
    """The event is set and the waiter cancelled with 0 to 5 loop steps between them: every
    interleaving ends with the waiter cancelled (``asyncio.wait_for`` returned in some)."""
    async def scenario(steps: int) -> bool:
        event = asyncio.Event()
        waiter = asyncio.create_task(wait_set(event, 30))
        await asyncio.sleep(0)
        event.set()
        for _ in range(steps):
            await asyncio.sleep(0)
        if not waiter.cancel():  # it had returned already: nothing to cancel
            return True
        await asyncio.gather(waiter, return_exceptions=True)
        return waiter.cancelled()

    assert all(asyncio.run(scenario(steps)) for steps in range(6))


def test_no_module_calls_asyncio_wait_for() -> None:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for" \
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                calls.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not calls, ("asyncio.wait_for swallows a cancellation on Python 3.11; use "
                       f"sglang_omni.aio.wait.wait_set or asyncio.timeout: {calls}")
