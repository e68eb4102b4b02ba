"""The generation limits rule itself: the model's documented sizes pass with the defaults, and
sizes the engines are known to refuse are refused before any work."""

from __future__ import annotations

import pytest

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.models.cosmos3.model import COSMOS3

check_generation_limits = COSMOS3.check_generation_limits  # the rule as the routes apply it
size_multiple = COSMOS3.size_multiple

DEFAULTS = ServerSettings()


@pytest.mark.parametrize("size", [(1280, 720), (720, 1280), (1024, 1024), (832, 480)])
def test_documented_image_sizes_pass(size: tuple[int, int]) -> None:
    check_generation_limits({"width": size[0], "height": size[1], "num_inference_steps": 100},
                            DEFAULTS, video=False, multiple=size_multiple("hf"))


def test_documented_video_passes() -> None:
    check_generation_limits({"width": 1280, "height": 720, "num_frames": 189,
                             "num_inference_steps": 100}, DEFAULTS, feeds_reasoner=True)
    check_generation_limits({}, DEFAULTS)  # every default
    check_generation_limits({}, DEFAULTS, action=True)


def test_a_missing_side_counts_as_the_default() -> None:
    with pytest.raises(BadRequest, match="16384x720 is 11796480 pixels"):
        check_generation_limits({"width": 16384}, DEFAULTS)


def test_the_hf_backend_size_multiple_is_known_before_work() -> None:
    with pytest.raises(BadRequest, match=r"^w\.width: .*multiple of 16, got 24; use for "
                                         r"example 16"):
        check_generation_limits({"width": 24, "height": 32}, DEFAULTS, where="w.",
                                multiple=size_multiple("hf"))
    check_generation_limits({"width": 24, "height": 32}, DEFAULTS,
                            multiple=size_multiple("scripted"))


def test_the_reasoner_aspect_rule_holds_whatever_the_setting() -> None:
    wide = ServerSettings(max_aspect_ratio=1000, max_pixels=10**8)
    check_generation_limits({"width": 3264, "height": 16}, wide)  # direct: the setting rules
    with pytest.raises(BadRequest, match="Reasoner"):
        check_generation_limits({"width": 3264, "height": 16}, wide, feeds_reasoner=True)


def test_wrong_types_are_left_to_the_type_checks() -> None:
    check_generation_limits({"width": "16384", "num_frames": True, "fps": 0.5}, DEFAULTS)


def test_limits_are_printed_as_exact_numbers() -> None:
    """A limit reads as the number to pass to --server.max_pixels, never as 2.08896e+06."""
    with pytest.raises(BadRequest) as info:
        check_generation_limits({"width": 1920, "height": 1920}, DEFAULTS)
    assert "over the server's limit of 2088960 (server.max_pixels)" in str(info.value)
    long = ServerSettings(max_frames=100_000, max_video_seconds=1000.5)
    with pytest.raises(BadRequest) as info:
        check_generation_limits({"width": 16, "height": 16, "num_frames": 24_001, "fps": 1},
                                long)
    assert "24001 frames at 1 fps are 24001 s of video, over the server's limit of 1000.5 " \
           "(server.max_video_seconds)" in str(info.value)
    wide = ServerSettings(max_pixels=10**9)
    with pytest.raises(BadRequest) as info:
        check_generation_limits({"width": 160_000, "height": 16}, wide)
    assert "has an aspect ratio of 10000, over the server's limit of 8 " in str(info.value)
