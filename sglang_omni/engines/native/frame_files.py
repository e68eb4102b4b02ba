"""The files native SGLang reads a request's ``omni-frame://N`` media from, each written once.

Native SGLang reads media from a path, so every frame a Reasoner turn names is written to a
file. The frames of a request are the same objects on every turn (the stage keeps them for the
request: ``runtime.request_media``), so a request's file for a frame is written on the first
turn that names it and reused by later turns, instead of every turn writing every frame again.
The request's folder (a :class:`~sglang_omni.media.RequestMediaDir`) is removed when the request
ends (``end_request``: its end, its abort or its failure), after its running job, if any, has
finished; whatever is left at the engine's close goes then.
"""

from __future__ import annotations

import mimetypes

import anyio

from sglang_omni.media import RequestMediaDir
from sglang_omni.media.types import sniff_mime

Frame = bytes | bytearray


def write_frame(data: Frame, workdir: RequestMediaDir) -> str:
    """Write ``data`` to a new file of ``workdir`` (its suffix from its sniffed type); its URI."""
    mime = sniff_mime(bytes(data[:16]))
    suffix = (mimetypes.guess_extension(mime) or "") if mime else ""
    path = workdir.new_file(suffix)
    path.write_bytes(data)
    return path.as_uri()


class FrameFiles:
    """One request's frame files: :meth:`uri` writes a frame's file once; :meth:`close`
    removes them all. Used by one job at a time (a request has one job on a stage at once)."""

    def __init__(self) -> None:
        self._dir: RequestMediaDir | None = None
        #: id(frame) -> (the frame, held so its id names it alone, its file's URI)
        self._uris: dict[int, tuple[Frame, str]] = {}
        #: Jobs of the request running now, and whether the request ended meanwhile.
        self.running = 0
        self.ended = False

    @property
    def written(self) -> int:
        """Frames written to a file so far."""
        return len(self._uris)

    async def uri(self, frame: Frame) -> str:
        """The URI of ``frame``'s file, written now (off the event loop) if it has none yet."""
        held = self._uris.get(id(frame))
        if held is not None and held[0] is frame:
            return held[1]
        if self._dir is None:
            self._dir = RequestMediaDir()
        uri = await anyio.to_thread.run_sync(write_frame, frame, self._dir)
        self._uris[id(frame)] = (frame, uri)
        return uri

    def close(self) -> None:
        """Remove the request's files; idempotent."""
        self._uris.clear()
        if self._dir is not None:
            self._dir.close()
            self._dir = None


class RequestFrameFiles:
    """The :class:`FrameFiles` of each running request, by request id (event loop only)."""

    def __init__(self) -> None:
        self._files: dict[str, FrameFiles] = {}

    def open(self, rid: str) -> FrameFiles:
        """``rid``'s files for a job starting now; :meth:`done` when the job ends."""
        files = self._files.get(rid)
        if files is None or files.ended:
            files = self._files[rid] = FrameFiles()
        files.running += 1
        return files

    def done(self, rid: str, files: FrameFiles) -> None:
        """A job of ``rid`` ended: remove the files if the request ended meanwhile."""
        files.running -= 1
        if files.ended and files.running <= 0:
            self._drop(rid, files)

    def end(self, rid: str) -> None:
        """Request ``rid`` ended: its files go now, or when its running job ends."""
        files = self._files.get(rid)
        if files is None:
            return
        files.ended = True
        if files.running <= 0:
            self._drop(rid, files)

    def _drop(self, rid: str, files: FrameFiles) -> None:
        files.close()
        if self._files.get(rid) is files:
            del self._files[rid]

    def close(self) -> None:
        """Remove every request's files (the engine closes)."""
        for files in self._files.values():
            files.close()
        self._files.clear()

    def __len__(self) -> int:
        return len(self._files)
