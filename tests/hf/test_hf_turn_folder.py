"""An hf Reasoner turn that reads every medium from the frames its stage holds (every turn of
an interleaved request) makes no temporary folder; a turn that fetches one makes one and
removes it when the turn's media are read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sglang_omni.contract.job import Job
from sglang_omni.engines.hf.conversation import read_conversation
from sglang_omni.media import MediaPolicy, workdir
from tests.chat.kit import png

PNG = png((1, 2, 3))


def folders_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    mkdtemp = workdir.tempfile.mkdtemp

    def counting(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(workdir.tempfile, "mkdtemp", counting)
    return made


def job_with(*urls: str, frames: list[bytes] | None = None) -> Job:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return Job("r1", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, *parts]}]}, list(frames or []),
               emit=lambda _chunk: None)


def test_a_turn_of_frames_only_makes_no_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    made = folders_made(monkeypatch)
    job = job_with("omni-frame://0", "omni-frame://1", frames=[PNG, PNG])
    conversation = asyncio.run(read_conversation(job, MediaPolicy()))
    assert [item.data for item in conversation.media] == [PNG, PNG]
    assert made == []


def test_a_turn_reading_a_local_file_removes_its_folder(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    (tmp_path / "cube.png").write_bytes(PNG)
    made = folders_made(monkeypatch)
    policy = MediaPolicy(allowed_local_media_path=str(tmp_path))
    conversation = asyncio.run(read_conversation(job_with(str(tmp_path / "cube.png")), policy))
    assert [item.data for item in conversation.media] == [PNG]
    assert len(made) <= 1 and not any(Path(p).exists() for p in made)
