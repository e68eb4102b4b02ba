"""The native Reasoner writes a request's frames (``omni-frame://N``) to files once per request:
later turns of the request reuse the files, which are removed when the request ends (its end,
its abort), after its running job, if any, has ended; none is left behind. Run against the real
sglang chat classes over the fakes of ``fakes.py`` (the native extra), as
``test_native_reasoner.py`` is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("sglang", reason="the native tier needs the pinned sglang (native extra)")

from sglang.test.test_utils import maybe_stub_sgl_kernel  # noqa: E402

maybe_stub_sgl_kernel()

from sglang_omni.contract.job import Job  # noqa: E402
from tests.chat.kit import png  # noqa: E402
from tests.native.test_native_reasoner import make, topology  # noqa: E402, F401

pytestmark = pytest.mark.native

MP4 = b"\x00\x00\x00\x18ftypisom" + b"\x00" * 16


def turn(text: str, frames: list[Any], rid: str = "r1") -> Job:
    """A Reasoner turn naming every frame of ``frames`` (as an interleaved turn does)."""
    parts = [{"type": "image_url" if f[:4] == b"\x89PNG" else "video_url",
              ("image_url" if f[:4] == b"\x89PNG" else "video_url"):
                  {"url": f"omni-frame://{i}"}} for i, f in enumerate(frames)]
    messages = [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]
    return Job(rid, {"messages": messages, "sampling": {}, "stream": False, "turn_index": 0},
               list(frames), emit=lambda _chunk: None)


def paths(obj: Any) -> list[Path]:
    urls = [i.url for i in obj.image_data or []] + list(obj.video_data or [])
    return [Path(urlsplit(u).path) for u in urls]


def test_a_requests_frames_are_written_once_and_removed_when_it_ends() -> None:
    reasoner = make()
    image, video = bytearray(png((1, 2, 3))), bytearray(MP4)  # as the stage keeps them

    async def scenario() -> list[list[Path]]:
        await reasoner.start()
        seen = []
        for frames in ([image], [image, video], [image, video]):
            await reasoner.run(turn("describe", frames))
            seen.append(paths(reasoner.engine.tokenizer_manager.requests[-1]))
            assert all(p.exists() for p in seen[-1])  # kept for the request's next turn
        return seen

    first, second, third = run(scenario)
    assert second[0] == first[0] and third == second  # each frame's file written once
    assert reasoner.frame_files._files["r1"].written == 2
    reasoner.end_request("r1")
    assert not any(p.exists() for p in third) and len(reasoner.frame_files) == 0
    assert not third[0].parent.exists()  # the request's folder too


def test_an_abort_during_a_turn_removes_the_files_once_the_turn_ended() -> None:
    reasoner = make()
    image = bytearray(png((4, 5, 6)))

    async def scenario() -> tuple[list[Path], bool]:
        await reasoner.start()
        tm = reasoner.engine.tokenizer_manager
        task = asyncio.create_task(reasoner.run(turn("SLOW", [image])))
        await asyncio.wait_for(tm.started.wait(), 30)
        written = paths(tm.requests[-1])
        reasoner.end_request("r1")  # the stage's abort: end_request, then the job's cancel
        kept = all(p.exists() for p in written)  # the running turn still reads them
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return written, kept

    written, kept = run(scenario)
    assert kept and written and not any(p.exists() for p in written)
    assert len(reasoner.frame_files) == 0


def test_close_removes_every_requests_files() -> None:
    reasoner = make()

    async def scenario() -> list[Path]:
        await reasoner.start()
        await reasoner.run(turn("describe", [bytearray(png((7, 7, 7)))], rid="a"))
        await reasoner.run(turn("describe", [bytearray(MP4)], rid="b"))
        written = [p for obj in reasoner.engine.tokenizer_manager.requests for p in paths(obj)]
        await reasoner.close()
        return written

    written = run(scenario)
    assert len(written) == 2 and not any(p.exists() for p in written)


def run(coro_fn: Any) -> Any:
    return asyncio.run(coro_fn())
