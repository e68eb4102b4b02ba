"""The random-weight note (unit): what a builder writes is what a server reads, and the demo's
configuration ends a request after one generation (tests/hf builds real checkpoints and serves
them; tests/playground shows the notice in chromium)."""

from __future__ import annotations

from pathlib import Path

from sglang_omni import cli
from sglang_omni.config import random_weights
from sglang_omni.serve.ops.startup import ready_line


def test_a_recorded_note_is_read_back(tmp_path: Path) -> None:
    random_weights.record(tmp_path, "sgl-omni make-checkpoint --shape micro --seed 4")
    note = random_weights.read(tmp_path)
    assert note is not None
    assert note.notice.startswith("random weights: images are noise and answers are gibberish")
    assert note.notice.endswith("(checkpoint built by sgl-omni make-checkpoint --shape micro "
                                "--seed 4)")


def test_no_note_means_trained_weights(tmp_path: Path) -> None:
    assert random_weights.read(tmp_path) is None  # a folder without the note
    assert random_weights.read(tmp_path / "missing") is None
    assert random_weights.read("nvidia/Cosmos3-Nano") is None  # a hub id
    assert random_weights.read(None) is None  # the scripted engines load no model
    (tmp_path / "file").write_text("x")
    assert random_weights.read(tmp_path / "file") is None


def test_an_unreadable_note_still_says_random(tmp_path: Path) -> None:
    (tmp_path / random_weights.MARKER).write_text("{not json")
    note = random_weights.read(tmp_path)
    assert note is not None and "random weights" in note.notice


def test_the_ready_line_says_it_before_the_playground() -> None:
    line = ready_line("umm", "http://127.0.0.1:8000", False, 2.5, notice="random weights: x")
    assert line.startswith("sgl-omni: ready in 2.5 s (random weights: x): open "
                           "http://127.0.0.1:8000/ (the playground), or try: curl -sN ")
    assert "random" not in ready_line("umm", "http://127.0.0.1:8000", False, 2.5)


def test_every_ready_line_curl_is_silent_and_bounded() -> None:
    for mode in ("umm", "chat", "generation"):
        for scripted in (False, True):
            curl = ready_line(mode, "http://h:1", False, 1.0,
                              scripted=scripted).split("or try: ", 1)[1]
            assert curl.startswith("curl -s"), (mode, curl)
            # media (base64) are cut; a chat answer is bounded by max_tokens
            assert curl.endswith(("| cut -c1-150", "| cut -c1-300")) or '"max_tokens": 32' in curl


def test_the_demo_ends_a_request_after_one_generation() -> None:
    args, extra = cli.build_parser().parse_known_args(
        ["serve", "--demo", "--model-path", "/models/tiny"])
    config = cli._resolve(args, extra)
    assert config.stage("orchestrator").factory["max_dispatches"] == 3
    args, extra = cli.build_parser().parse_known_args(
        ["serve", "--demo", "--model-path", "/models/tiny",
         "--orchestrator.factory.max_dispatches", "17"])
    assert cli._resolve(args, extra).stage("orchestrator").factory["max_dispatches"] == 17


def test_server_info_is_not_a_model_request_for_the_fleet() -> None:
    """The playground reads /server_info on every page load; a replica's in-flight count (what
    the fleet routes by) counts model requests only."""
    from sglang_omni.scale.stats import ReplicaStats

    assert not ReplicaStats.counts("/server_info")
    assert ReplicaStats.counts("/generate")
