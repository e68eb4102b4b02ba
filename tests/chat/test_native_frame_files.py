"""The native Reasoner's frame files, without sglang installed (``tests/native`` runs the engine
over the real sglang chat classes): a request's ``omni-frame://N`` media are written to files
once per request, reused by its later turns, and removed when the request ends, after a turn
still running has ended."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

from sglang_omni.engines.native.frame_files import RequestFrameFiles
from sglang_omni.engines.native.reasoner_request import localize_media
from sglang_omni.media import LazyMediaDir, MediaPolicy, RequestMediaDir
from tests.chat.kit import data_url, png

IMAGE = bytearray(png((1, 2, 3)))  # as the stage keeps a request's media: one object per item
VIDEO = bytearray(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 16)


def turn(frames: list[bytearray]) -> list[dict]:
    parts = [{"type": kind, kind: {"url": f"omni-frame://{i}"}} for i, kind in
             enumerate("image_url" if f is IMAGE else "video_url" for f in frames)]
    return [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]


def files_of(messages: list[dict]) -> list[Path]:
    return [Path(urlsplit(p[p["type"]]["url"]).path) for p in messages[0]["content"][1:]]


async def one_turn(requests: RequestFrameFiles, rid: str, frames: list[bytearray]) -> list[Path]:
    files = requests.open(rid)
    try:
        with RequestMediaDir() as workdir:
            messages = await localize_media(turn(frames), list(frames), MediaPolicy(), workdir,
                                            frame_files=files)
            return files_of(messages)
    finally:
        requests.done(rid, files)


def test_each_frame_is_written_once_per_request_and_removed_when_it_ends() -> None:
    requests = RequestFrameFiles()

    async def scenario() -> list[list[Path]]:
        return [await one_turn(requests, "r1", frames)
                for frames in ([IMAGE], [IMAGE, VIDEO], [IMAGE, VIDEO])]

    first, second, third = asyncio.run(scenario())
    assert second[0] == first[0] and third == second  # later turns reuse the files
    assert all(p.exists() for p in third) and third[0].read_bytes() == IMAGE
    assert third[1].suffix == ".mp4" and third[1].read_bytes() == VIDEO
    requests.end("r1")
    assert not any(p.exists() for p in third) and not third[0].parent.exists()
    assert len(requests) == 0


def test_an_end_during_a_turn_removes_the_files_when_the_turn_ends() -> None:
    requests = RequestFrameFiles()

    async def scenario() -> tuple[list[Path], bool]:
        files = requests.open("r1")
        path = Path(urlsplit(await files.uri(IMAGE)).path)
        requests.end("r1")  # an abort: the running turn may still read the file
        kept = path.exists()
        requests.done("r1", files)
        return [path], kept

    written, kept = asyncio.run(scenario())
    assert kept and not written[0].exists() and len(requests) == 0


def test_a_request_id_used_again_after_its_end_gets_fresh_files() -> None:
    requests = RequestFrameFiles()

    async def scenario() -> tuple[Path, Path]:
        before = await one_turn(requests, "r1", [IMAGE])
        requests.end("r1")
        after = await one_turn(requests, "r1", [IMAGE])
        return before[0], after[0]

    before, after = asyncio.run(scenario())
    assert not before.exists() and after.exists() and before != after
    requests.close()
    assert not after.exists()


def test_without_request_files_a_turn_writes_its_own() -> None:
    async def scenario() -> tuple[list[Path], list[Path]]:
        with RequestMediaDir() as workdir:
            messages = await localize_media(turn([IMAGE]), [IMAGE], MediaPolicy(), workdir)
            inside = files_of(messages)
            assert all(p.exists() for p in inside)
        return inside, files_of(messages)

    inside, after = asyncio.run(scenario())
    assert not any(p.exists() for p in after)


def test_a_turn_of_the_requests_frames_only_makes_no_turn_folder() -> None:
    requests = RequestFrameFiles()

    async def scenario() -> tuple[bool, bool]:
        files = requests.open("r1")
        with LazyMediaDir() as frames_only, LazyMediaDir() as with_inline:
            await localize_media(turn([IMAGE]), [IMAGE], MediaPolicy(), frames_only,
                                 frame_files=files)
            inline = [{"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": data_url("image/png", bytes(IMAGE))}}]}]
            await localize_media(inline, [], MediaPolicy(), with_inline, frame_files=files)
            made = frames_only.made, with_inline.made
        requests.done("r1", files)
        requests.end("r1")
        return made

    assert asyncio.run(scenario()) == (False, True)  # a data: URL is written to the turn's
