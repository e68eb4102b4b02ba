"""The per-request temporary folder that holds fetched and decoded media.

Every file Omni writes for a request (fetched remote media, decoded ``data:`` URLs) lives in the
request's :class:`RequestMediaDir`, a private folder (mode 0700, files 0600) that is removed when
the request ends: on ``with``/``async with`` exit whatever the outcome (error, cancellation),
on an explicit :meth:`RequestMediaDir.close`, or, as a last resort, when the object is garbage
collected or the interpreter exits.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import weakref
from pathlib import Path
from types import TracebackType

_SUFFIX_RE = re.compile(r"^\.[A-Za-z0-9]{1,15}$")


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _host() -> str:
    """This host and PID namespace (``name.ns``): two containers that share a host name and a
    folder, each with its own process ids, never judge each other's folders."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{re.sub(r'[^A-Za-z0-9.]', '_', socket.gethostname()) or 'host'}.{namespace}"


def owned_prefix(prefix: str) -> str:
    """``prefix`` marked with this host, PID namespace and process (``{prefix}{host}-{pid}-``),
    so that :func:`remove_orphans` can tell a folder whose process is gone from one in use."""
    return f"{prefix}{_host()}-{os.getpid()}-"


def remove_orphans(base: str | os.PathLike[str], prefix: str) -> list[str]:
    """Remove the folders under ``base`` made with ``owned_prefix(prefix)`` by a process of
    this host and PID namespace that no longer runs (one killed before it could remove them);
    the names removed.

    Folders of other hosts or namespaces (a shared ``base``) and of running processes are left
    alone.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}{re.escape(_host())}-(\d+)-")
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if not _running(int(match.group(1))):
            _remove(entry.path)
            if not os.path.lexists(entry.path):  # another user's folder may stay
                removed.append(entry.name)
    return removed


def _running(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (one of another user's counts)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid at all)
        return False
    except PermissionError:
        return True
    return True


class RequestMediaDir:
    """A temporary folder owned by one request; removed on exit, idempotently.

    ``base``: the parent folder (default: the system temp folder). The folder is created at
    construction. Closing is synchronous and never awaits, so a cancelled task still removes it.
    """

    def __init__(self, base: str | os.PathLike[str] | None = None, *, prefix: str = "omni-media-"):
        self._path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        self._finalizer = weakref.finalize(self, _remove, str(self._path))
        #: Media bytes this request fetched or decoded from inline data so far, counted against
        #: ``MediaPolicy.max_media_bytes`` by :mod:`sglang_omni.media.fetch`.
        self.media_bytes = 0

    @property
    def path(self) -> Path:
        """The folder's path (it no longer exists once closed)."""
        return self._path

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def new_file(self, suffix: str = "") -> Path:
        """Create an empty private file in the folder and return its path.

        ``suffix`` is kept only if it looks like a file extension (``.png``); it is dropped
        otherwise, so a client-chosen suffix can never add path components.
        """
        if self.closed:
            raise RuntimeError("the request's media folder is already closed")
        fd, name = tempfile.mkstemp(
            suffix=suffix if _SUFFIX_RE.match(suffix) else "", dir=self._path
        )
        os.close(fd)
        return Path(name)

    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` (resolved) lies inside this folder."""
        resolved = Path(os.path.realpath(os.fspath(path)))
        return resolved.is_relative_to(Path(os.path.realpath(self._path)))

    def close(self) -> None:
        """Remove the folder and everything in it. Safe to call more than once."""
        self._finalizer()

    def __enter__(self) -> RequestMediaDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> RequestMediaDir:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LazyMediaDir:
    """A :class:`RequestMediaDir` made only when something is written (:meth:`get`): most
    Reasoner turns read every medium from the frames their stage holds and write nothing, so
    they make no folder. ``with`` it: the folder, if made, is removed when the block ends."""

    def __init__(self) -> None:
        self._dir: RequestMediaDir | None = None

    @property
    def made(self) -> bool:
        """Whether the folder was made."""
        return self._dir is not None

    def get(self) -> RequestMediaDir:
        """The folder, made now if it was not yet."""
        if self._dir is None:
            self._dir = RequestMediaDir()
        return self._dir

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()

    def __enter__(self) -> LazyMediaDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
