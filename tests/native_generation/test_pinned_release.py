"""What the native generation engine uses of SGLang 0.5.23 exists, with the shapes it relies on
(native tier; imports the real classes on the CPU, no model)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang_omni.contract.generation_options import OPTIONS  # noqa: E402
from sglang_omni.engines.native.generation import sampling_kwargs  # noqa: E402
from sglang_omni.engines.native.generation_cancellation import native_abort_method  # noqa: E402
from sglang_omni.engines.native.generation_checks import check_ffmpeg_aac  # noqa: E402
from sglang_omni.engines.native.generation_driver import SGLangDiffusion  # noqa: E402

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def generator_cls() -> type:
    from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator

    return DiffGenerator


def test_diffgenerator_surface(generator_cls: type) -> None:
    from sglang.multimodal_gen import DiffGenerator as LazyDiffGenerator

    assert LazyDiffGenerator.from_pretrained.__qualname__ == "DiffGenerator.from_pretrained"
    params = inspect.signature(generator_cls.from_pretrained).parameters
    assert "local_mode" in params and params["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    assert list(inspect.signature(generator_cls.generate).parameters)[:2] == [
        "self", "sampling_params_kwargs"]
    assert callable(generator_cls.shutdown)
    assert "self.local_scheduler_process" in inspect.getsource(generator_cls.__init__)


def test_the_pinned_release_cannot_cancel_natively(generator_cls: type) -> None:
    assert native_abort_method(generator_cls) is None
    assert SGLangDiffusion().native_abort() is None


def test_every_native_kwarg_the_engine_sends_is_a_cosmos3_sampling_field(tmp_path: Path) -> None:
    from sglang.multimodal_gen.configs.sample.cosmos3 import Cosmos3SamplingParams

    fields = {f.name for f in dataclasses.fields(Cosmos3SamplingParams)}
    everything = {key: None for key in OPTIONS}
    sent = set(sampling_kwargs("video", "p", {**everything, "num_frames": 9,
                                               "generate_sound": True},
                               request_id="r", folder=tmp_path))
    sent |= set(sampling_kwargs("video", "p", {key: 1 for key in OPTIONS
                                               if key not in ("generate_sound",)},
                                request_id="r", folder=tmp_path))
    assert sent - fields == set()
    assert "generate_sound" not in fields and "sound_duration" in fields  # mapped by Omni
    assert "action_horizon" not in fields  # mapped to num_frames by Omni


def test_action_route_helpers(generator_cls: type) -> None:
    from sglang.multimodal_gen.runtime.entrypoints.action import protocol
    from sglang.multimodal_gen.runtime.entrypoints.utils import GenerationResult, prepare_request
    from sglang.multimodal_gen.runtime.scheduler_client import sync_scheduler_client

    assert list(inspect.signature(protocol.build_action_sampling_params).parameters) == [
        "payload", "server_args"]
    assert list(inspect.signature(protocol.action_generation_response).parameters)[:2] == [
        "output", "server_args"]
    assert "output" in inspect.signature(protocol.action_raw_response).parameters
    assert list(inspect.signature(prepare_request).parameters)[:2] == [
        "server_args", "sampling_params"]
    assert callable(sync_scheduler_client.forward) and callable(sync_scheduler_client.close)
    assert "output_file_path" in {f.name for f in dataclasses.fields(GenerationResult)}


def test_the_pinned_ffmpeg_has_aac() -> None:
    check_ffmpeg_aac(SGLangDiffusion().ffmpeg())
