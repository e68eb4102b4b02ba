"""Watching the processes a native engine started: the first one to exit ends the wait.

A native SGLang scheduler or detokenizer that exits leaves its engine unable to serve, so the
stage reports the failure and stops (see ``runtime.stage.process``). Each watched process is a probe
returning None while it runs and its exit code once it has exited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from multiprocessing.process import BaseProcess

import psutil

from sglang_omni.aio.wait import wait_set

ExitProbe = Callable[[], int | None]
#: Exit code reported for a process whose code cannot be read (not our child, or reaped).
UNKNOWN_EXIT = -1


def process_probe(proc: BaseProcess) -> ExitProbe:
    """Probe a ``multiprocessing`` child (reads ``exitcode``, which reaps it)."""
    return lambda: proc.exitcode


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs, without reaping it: a zombie has exited, and a later
    process given the same pid is not ``proc`` (psutil checks its start time)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def psutil_probe(proc: psutil.Process) -> ExitProbe:
    """Probe any process by pid without reaping it; a zombie counts as exited."""
    return lambda: None if running(proc) else UNKNOWN_EXIT


def exited(probes: Mapping[str, ExitProbe]) -> str | None:
    """``"NAME exited with code C"`` for the first probe that reports an exit, else None."""
    for name, probe in probes.items():
        code = probe()
        if code is not None:
            how = "with an unknown code" if code == UNKNOWN_EXIT else f"with code {code}"
            return f"{name} exited {how}"
    return None


async def first_exit(probes: Mapping[str, ExitProbe], poll_s: float = 0.2,
                     wake: asyncio.Event | None = None, settle_s: float = 2.0) -> str:
    """Wait until a watched process exits and describe it.

    ``wake`` (for example set by a SIGQUIT a failing native process sends its parent) ends the
    wait too: the probes then get ``settle_s`` to see the process exit before the description
    falls back to the wake-up alone.
    """
    while True:
        found = exited(probes)
        if found is not None:
            return found
        if wake is not None and wake.is_set():
            deadline = asyncio.get_running_loop().time() + settle_s
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(poll_s)
                found = exited(probes)
                if found is not None:
                    return found
            return "a native SGLang process signalled a failure (SIGQUIT)"
        if wake is None:
            await asyncio.sleep(poll_s)
        else:
            await wait_set(wake, poll_s)
