"""RequestMediaDir: the per-request temp folder is private and always removed."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_omni.media import RequestMediaDir
from sglang_omni.media.workdir import owned_prefix, remove_orphans


def test_removed_on_exit_and_close_is_idempotent(tmp_path: Path) -> None:
    with RequestMediaDir(tmp_path) as workdir:
        f = workdir.new_file(".png")
        f.write_bytes(b"x")
        assert stat.S_IMODE(workdir.path.stat().st_mode) == 0o700
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert f.parent == workdir.path and f.suffix == ".png"
    assert not workdir.path.exists() and workdir.closed
    workdir.close()
    workdir.close()
    with pytest.raises(RuntimeError):
        workdir.new_file()


def test_removed_on_error(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), RequestMediaDir(tmp_path) as workdir:
        workdir.new_file().write_bytes(b"x")
        1 / 0  # noqa: B018
    assert list(tmp_path.iterdir()) == []


def test_removed_on_async_error_and_cancel(tmp_path: Path) -> None:
    async def fails() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            workdir.new_file()
            raise ValueError

    async def hangs(started: asyncio.Event) -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            workdir.new_file()
            started.set()
            await asyncio.sleep(60)

    async def go() -> None:
        with pytest.raises(ValueError):
            await fails()
        started = asyncio.Event()
        task = asyncio.create_task(hangs(started))
        await started.wait()
        assert len(list(tmp_path.iterdir())) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert list(tmp_path.iterdir()) == []


def test_removed_when_forgotten(tmp_path: Path) -> None:
    workdir = RequestMediaDir(tmp_path)
    workdir.new_file()
    path = workdir.path
    del workdir
    gc.collect()
    assert not path.exists()


@pytest.mark.parametrize("suffix", ["/../../x", "../x", ".png/..", ".a b", "." + "x" * 40, "png"])
def test_suffix_cannot_add_path_components(tmp_path: Path, suffix: str) -> None:
    with RequestMediaDir(tmp_path) as workdir:
        f = workdir.new_file(suffix)
        assert f.parent == workdir.path and f.suffix == ""


def test_folders_of_a_killed_process_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """A process killed with SIGKILL cannot remove its request folders; the next process to
    start on the same folder removes them (native generation's ``output_dir``), and only them."""
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from sglang_omni.media import RequestMediaDir\n"
         "from sglang_omni.media.workdir import owned_prefix\n"
         f"d = RequestMediaDir({str(tmp_path)!r}, prefix=owned_prefix('omni-gen-'))\n"
         "d.new_file('.mp4').write_bytes(b'x' * 1000)\n"
         "print(d.path.name, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        orphan = child.stdout.readline().strip()
        assert orphan.startswith("omni-gen-")
        mine = RequestMediaDir(tmp_path, prefix=owned_prefix("omni-gen-"))
        assert remove_orphans(tmp_path, "omni-gen-") == []  # its process still runs
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    other_host = tmp_path / f"omni-gen-elsewhere.1-{child.pid}-abc"
    other_host.mkdir()  # a shared output_dir: another host's folder is not ours to judge
    host, _, namespace = owned_prefix("").split("-")[0].rpartition(".")
    other_namespace = tmp_path / f"omni-gen-{host}.{int(namespace) + 1}-{child.pid}-abc"
    other_namespace.mkdir()  # a container with the same host name: its pids are not ours
    unrelated = tmp_path / "omni-media-xyz"
    unrelated.mkdir()
    assert remove_orphans(tmp_path, "omni-gen-") == [orphan]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.path.name, other_host.name, other_namespace.name, unrelated.name])
    mine.close()
    assert remove_orphans(tmp_path / "missing", "omni-gen-") == []
