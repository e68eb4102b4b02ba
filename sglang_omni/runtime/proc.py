"""Process hygiene: a stage dies with the server, and takes its children down with it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Protocol

PR_SET_PDEATHSIG = 1


class Leader(Protocol):
    """A child process that leads a process group of its own (a stage: ``setpgid(0, 0)``):
    ``exitcode`` is None until it has exited and been reaped."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: deliver ``sig`` to this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except OSError:
        return


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal every process of group ``pgid``; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return


def kill_led_group(leader: Leader, sig: int = signal.SIGKILL) -> None:
    """Signal ``leader`` and what is left of its process group (its children).

    Once the leader is reaped its pid is free for reuse, except while members of its group live
    (the kernel gives the number of a live group to no process). So a process numbered so after
    the leader was reaped is another's, perhaps leading a group of its own (pids wrap at 32768 by
    default): it and its group are left alone. A leader not reaped yet is signalled itself too
    (it may not have made its group yet)."""
    pid = leader.pid
    if not pid:
        return
    if leader.exitcode is not None:  # reaped
        if _exists(pid):
            return
        kill_group(pid, sig)
        return
    kill_group(pid, sig)
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_idle_child() -> subprocess.Popen:
    """An idle child process standing in for a native engine worker (scripted backend)."""
    code = "import time\nwhile True: time.sleep(3600)"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)
