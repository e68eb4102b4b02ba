"""The generation stage's GPU turns (``contract.gpu_turns``) with jobs that step on the event loop,
as the scripted generator does: nesting (each older arrival pauses the one running), the memory
budget and the nesting bound (then the older one waits for the end), no progress reported while
waiting, and cancellation of a paused job."""

from __future__ import annotations

import asyncio
import threading

from sglang_omni.contract.gpu_turns import MAX_PAUSED, WAIT_POLL_S, GpuTurns, Turn

STEPS = 6


class Stepper:
    """A job of ``STEPS`` steps under ``turns``; the test says when each step may run."""

    def __init__(self, turns: GpuTurns, rid: str, order: float, log: list[str],
                 kept: int = 100) -> None:
        self.rid, self.log, self.kept = rid, log, kept
        self.cancelled = threading.Event()
        self.progressed = 0
        self.turn: Turn = turns.turn(rid, order, self.cancelled, self._progress)
        self.at_step = asyncio.Event()  # set at each step boundary reached

    def _progress(self) -> None:
        self.progressed += 1

    async def run(self, gate: asyncio.Event | None = None) -> None:
        await self.turn.begin()
        try:
            for step in range(1, STEPS + 1):
                self.log.append(f"{self.rid}{step}")
                if step < STEPS:
                    self.at_step.set()
                    if gate is not None:
                        await gate.wait()
                    await self.turn.boundary_async(self.kept, step, STEPS)
        finally:
            self.turn.end()


async def until(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def test_each_older_arrival_pauses_the_running_job_and_the_oldest_paused_resumes_first() -> None:
    async def scenario() -> list[str]:
        turns = GpuTurns(budget_bytes=1000)
        log: list[str] = []
        young, middle, old = (Stepper(turns, r, o, log) for r, o in
                              (("C", 3.0), ("B", 2.0), ("A", 1.0)))
        gate_c, gate_b = asyncio.Event(), asyncio.Event()
        c = asyncio.create_task(young.run(gate_c))
        await young.at_step.wait()  # C is at its first boundary
        b = asyncio.create_task(middle.run(gate_b))
        await until(lambda: turns.stats()["paused"] == 0 and not b.done(), "B waits")
        gate_c.set()  # C reaches the boundary with B waiting: it pauses
        await middle.at_step.wait()
        assert turns.stats()["paused"] == 1
        a = asyncio.create_task(old.run())
        await asyncio.sleep(0)
        gate_b.set()  # B pauses for A
        await asyncio.gather(a, b, c)
        assert turns.stats() == {"preemptions": 2, "paused": 0, "paused_bytes": 0}
        assert (young.turn.pauses, middle.turn.pauses, old.turn.pauses) == (1, 1, 0)
        return log

    log = asyncio.run(scenario())
    # C ran a step, B a step, then A whole, then B, then C
    assert log == ["C1", "B1", *(f"A{i}" for i in range(1, STEPS + 1)),
                   *(f"B{i}" for i in range(2, STEPS + 1)), *(f"C{i}" for i in range(2, STEPS + 1))]


def test_over_the_budget_or_the_nesting_bound_the_older_job_waits_for_the_end() -> None:
    async def scenario(budget: int, paused_already: int) -> list[str]:
        turns = GpuTurns(budget_bytes=budget)
        log: list[str] = []
        holders = []
        for i in range(paused_already):  # jobs paused already, each by the next older one
            holders.append(Stepper(turns, f"P{i}", 10.0 - i, [], kept=1))
        gates = [asyncio.Event() for _ in holders]
        tasks = []
        for i, (stepper, gate) in enumerate(zip(holders, gates, strict=True)):
            tasks.append(asyncio.create_task(stepper.run(gate)))
            if i > 0:  # the one before, at its boundary, pauses for this older one
                await asyncio.sleep(0)
                gates[i - 1].set()
            await stepper.at_step.wait()
            assert turns.stats()["paused"] == i
        young, gate_y = Stepper(turns, "Y", 5.0, log, kept=500), asyncio.Event()
        tasks.append(asyncio.create_task(young.run(gate_y)))
        if holders:  # Y is older than them all and pauses the last (the bound is reached)
            await asyncio.sleep(0)
            gates[-1].set()
        await young.at_step.wait()
        old = Stepper(turns, "O", 1.0, log)
        tasks.append(asyncio.create_task(old.run()))
        await asyncio.sleep(0)  # O waits for the GPU
        gate_y.set()
        await asyncio.gather(*tasks)
        return log

    whole_first = [*(f"Y{i}" for i in range(1, STEPS + 1)), *(f"O{i}" for i in range(1, STEPS + 1))]
    assert asyncio.run(scenario(budget=400, paused_already=0)) == whole_first  # 500 > 400
    assert asyncio.run(scenario(budget=10_000, paused_already=MAX_PAUSED)) == whole_first
    paused = asyncio.run(scenario(budget=10_000, paused_already=0))
    assert paused[0] == "Y1" and paused[1:1 + STEPS] == [f"O{i}" for i in range(1, STEPS + 1)]


def test_a_paused_job_reports_no_progress_and_its_cancellation_frees_what_it_kept() -> None:
    async def scenario() -> None:
        turns = GpuTurns(budget_bytes=1000)
        log: list[str] = []
        young, old = Stepper(turns, "Y", 2.0, log, kept=300), Stepper(turns, "O", 1.0, log)
        gate_y, gate_o = asyncio.Event(), asyncio.Event()
        y = asyncio.create_task(young.run(gate_y))
        await young.at_step.wait()
        o = asyncio.create_task(old.run(gate_o))
        await asyncio.sleep(0)
        gate_y.set()
        await old.at_step.wait()  # O runs, Y is paused
        assert turns.stats()["paused_bytes"] == 300
        # paused, it reports no progress: the stage is judged by the job holding the GPU (a
        # waiting job's reports would hide a hung holder from the hang detection)
        at_pause = young.progressed
        await asyncio.sleep(3 * WAIT_POLL_S)  # three of its polls for cancellation
        assert young.progressed == at_pause
        young.cancelled.set()
        y.cancel()
        await asyncio.gather(y, return_exceptions=True)
        assert turns.stats()["paused_bytes"] == 0 and turns.stats()["paused"] == 0
        gate_o.set()
        await o
        assert log[-1] == f"O{STEPS}"

    asyncio.run(scenario())



def test_a_waiting_job_cancelled_as_the_gpu_is_handed_to_it_does_not_run() -> None:
    """The stage aborts two jobs: the running one, whose end hands the GPU to the waiting one,
    and the waiting one, cancelled some loop steps later (0 to 8: every interleaving of the
    hand-over with the cancellation). The waiting job must end cancelled, never run. (Python
    3.11's ``asyncio.wait_for`` returns the inner result when it lands with the cancellation,
    swallowing it: an aborted job then ran its whole generation.)"""
    async def scenario(steps: int) -> tuple[bool, list[str]]:
        turns = GpuTurns(budget_bytes=0)
        log: list[str] = []
        first, second = Stepper(turns, "A", 1.0, log), Stepper(turns, "B", 2.0, log)
        a = asyncio.create_task(first.run(asyncio.Event()))
        await first.at_step.wait()
        b = asyncio.create_task(second.run())
        await until(lambda: second.turn.wake is not None, "B waits for the GPU")
        first.cancelled.set()
        a.cancel()
        for _ in range(steps):
            await asyncio.sleep(0)
        second.cancelled.set()
        if not b.cancel():  # B had the GPU and ended already: nothing to abort
            return True, []
        at_cancel = len(log)
        await asyncio.gather(a, b, return_exceptions=True)
        return b.cancelled(), log[at_cancel:]

    for steps in range(9):
        b_cancelled, after = asyncio.run(scenario(steps))
        assert b_cancelled and not after, f"{steps} loop steps: B ran {after} after its abort"
