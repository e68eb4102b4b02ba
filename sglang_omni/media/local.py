"""Local media: ``file://`` URLs and bare paths, resolved and confined to one folder.

Resolution follows symlinks and ``..`` exactly as the kernel will when the file is opened
(:func:`os.path.realpath`), and the result must lie inside the (itself resolved) root, compared
component-wise, so neither a link nor a traversal nor a sibling such as ``/data/media-evil`` for
root ``/data/media`` escapes. Relative bare paths are resolved against the server's working
directory, as native SGLang opens them.

Callers should hand the engine the *resolved* path this module returns, not the original string:
the engine then opens exactly the file that was checked. (A writer inside the root who swaps a
checked component for a symlink between check and open is outside this module's threat model.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

FILE_URL_PREFIX = "file://"


class PathRejected(ValueError):
    """A local reference outside the accepted forms; the message states the rule."""


def file_url_path(ref: str) -> str:
    """The filesystem path a ``file://`` URL names, decoded as native SGLang decodes it.

    Only ``file:///abs/path`` and ``file://localhost/abs/path`` are accepted, with a lowercase
    ``file://`` prefix (the form native SGLang recognizes), no ``?`` or ``#``, no NUL.
    Percent-escapes are decoded (``%2e%2e`` is ``..`` and is then resolved like any ``..``).
    """
    if not ref.startswith(FILE_URL_PREFIX):
        raise PathRejected("write file URLs as file:///absolute/path")
    parts = urlsplit(ref)
    if parts.netloc not in ("", "localhost"):
        raise PathRejected("file URLs must name a local file (file:///absolute/path)")
    if "?" in ref or "#" in ref:
        raise PathRejected("file URLs must not carry a query or fragment (percent-encode ? and #)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise PathRejected("file URLs must hold an absolute path")
    return path


def resolve_path(path: str) -> Path:
    """Resolve ``path`` (symlinks, ``.``, ``..``; relative to the working directory)."""
    if not path:
        raise PathRejected("the path is empty")
    if "\x00" in path:
        raise PathRejected("the path contains a NUL byte")
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError) as e:
        raise PathRejected(f"the path cannot be resolved ({e})") from None


def resolve_root(root: str | os.PathLike[str]) -> Path:
    """Resolve the ``--allowed-local-media-path`` folder; it must exist and be a directory."""
    resolved = Path(os.path.realpath(os.fspath(root)))
    if not resolved.is_dir():
        raise ValueError(f"--allowed-local-media-path {os.fspath(root)!r} is not a directory")
    return resolved


def confine(path: str, root: Path) -> Path:
    """Resolve ``path`` and return it if it lies inside ``root`` (already resolved).

    Raises :class:`PathRejected` when the resolved path is outside ``root``.
    """
    resolved = resolve_path(path)
    if resolved != root and not resolved.is_relative_to(root):
        raise PathRejected("the path resolves outside --allowed-local-media-path")
    return resolved


def confine_file(path: str, root: Path) -> Path:
    """Like :func:`confine`, and the result must be an existing regular file.

    Raises :class:`PathRejected` for a directory (``is a directory``), a missing path or anything
    that is not a regular file (a device or FIFO would block or never end).
    """
    resolved = confine(path, root)
    try:
        mode = os.stat(resolved).st_mode
    except FileNotFoundError:
        raise PathRejected("no such file inside --allowed-local-media-path") from None
    except OSError:
        raise PathRejected("the file cannot be read") from None
    if stat.S_ISDIR(mode):
        raise PathRejected("the path is a directory; name a media file")
    if not stat.S_ISREG(mode):
        raise PathRejected("the path is not a regular file")
    return resolved
