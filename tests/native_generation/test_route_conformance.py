"""Conformance of Omni's direct generation routes with the pinned release's (native tier).

The real SGLang 0.5.23 request models (``multimodal_gen.runtime.entrypoints.openai.protocol``)
judge a table of sample bodies; Omni's routes (a scripted generation server) must accept what
they accept and refuse what they refuse, except on the rows marked as deliberate differences,
each with its reason (the README's direct generation section lists them). The table is checked
against the native models too, so a release that changes its models fails here first.

The native route mapping: every form field the native video and image edit routes declare is
either served by Omni's route or refused by name, for a stated reason.
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("sglang")

import httpx  # noqa: E402
import msgpack  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from sglang_omni.serve.direct.fields import EDIT_FIELDS, VIDEO_FIELDS  # noqa: E402
from sglang_omni.serve.schemas.direct import IMAGE_OPTIONS, VIDEO_OPTIONS  # noqa: E402
from tests.server import SCRIPTED_GENERATION, Server  # noqa: E402

BUSY = "another realtime session is already active"

pytestmark = pytest.mark.native

PROTOCOL = "sglang.multimodal_gen.runtime.entrypoints.openai.protocol"
IMAGES, VIDEOS = "/v1/images/generations", "/v1/videos"
MODELS = {IMAGES: "ImageGenerationsRequest", VIDEOS: "VideoGenerationsRequest"}
SMALL = {"size": "32x32"}


@dataclass(frozen=True)
class Row:
    """A sample body; ``native``/``omni``: whether each accepts it; ``why``: the reason they
    differ (None where they agree)."""

    route: str
    body: dict[str, Any]
    native: bool
    omni: bool
    why: str | None = None


STRICT = "Omni validates types strictly (no coercion of text or floats to integers)"
ONE = "each Omni generation returns one media item"
UNKNOWN = "Omni refuses a field it would otherwise ignore, naming it"
POLICY = "every media reference passes Omni's media policy (no local files by default)"
ROWS = [
    Row(IMAGES, {"prompt": "a cube", **SMALL}, True, True),
    Row(IMAGES, {"prompt": "a cube", "response_format": "url", **SMALL}, True, True),
    Row(IMAGES, {"prompt": "a cube", "width": 32, "height": 32, "seed": 3,
                 "num_inference_steps": 2, "guidance_scale": 2.5, "negative_prompt": "blur"},
        True, True),
    Row(IMAGES, {"prompt": "a cube", "n": 1, "model": "m", "user": "u", **SMALL}, True, True),
    Row(IMAGES, {}, False, False),
    Row(IMAGES, {"prompt": 5}, False, False),
    Row(IMAGES, {"prompt": "c", "size": 5}, False, False),
    Row(IMAGES, {"prompt": "c", "num_inference_steps": "four"}, False, False),
    Row(IMAGES, {"prompt": "c", "guidance_scale": "high"}, False, False),
    Row(IMAGES, {"prompt": "c", "width": 32.5, "height": 32}, False, False),
    Row(IMAGES, {"prompt": "c", "seed": "x"}, False, False),
    Row(IMAGES, {"prompt": "c", "n": 2, **SMALL}, True, False, ONE),
    Row(IMAGES, {"prompt": "c", "seed": "7", **SMALL}, True, False, STRICT),
    Row(IMAGES, {"prompt": "c", "width": 32.0, "height": 32}, True, False, STRICT),
    Row(IMAGES, {"prompt": "c", "style": "vivid", **SMALL}, True, False, UNKNOWN),
    Row(IMAGES, {"prompt": "c", "output_format": "jpeg", **SMALL}, True, False,
        "native Cosmos3 writes PNG images; Omni refuses another format"),
    Row(VIDEOS, {"prompt": "a wave", "num_frames": 2, **SMALL}, True, True),
    Row(VIDEOS, {"prompt": "a wave", "fps": 8, "num_frames": 9, "seed": 1, **SMALL}, True, True),
    Row(VIDEOS, {"prompt": "a wave", "seconds": 1, "fps": 2, **SMALL}, True, True),
    Row(VIDEOS, {"prompt": "a wave", "num_frames": 2, "extra_params": {"seed": 3}, **SMALL},
        True, True),
    Row(VIDEOS, {}, False, False),
    Row(VIDEOS, {"prompt": ["a", "b"]}, False, False),
    Row(VIDEOS, {"prompt": "w", "seconds": "x"}, False, False),
    Row(VIDEOS, {"prompt": "w", "input_reference": 5}, False, False),
    Row(VIDEOS, {"prompt": "w", "num_frames": "nine"}, False, False),
    Row(VIDEOS, {"prompt": "w", "n": 2, "num_frames": 2, **SMALL}, True, False, ONE),
    Row(VIDEOS, {"prompt": "w", "num_frames": 2, "output_path": "/tmp/x", **SMALL}, True, False,
        "Omni returns media itself and owns the native output folders"),
    Row(VIDEOS, {"prompt": "w", "num_frames": 2, "input_reference": "/etc/passwd", **SMALL},
        True, False, POLICY),
]


def native_accepts(route: str, body: dict[str, Any]) -> bool:
    model = getattr(importlib.import_module(PROTOCOL), MODELS[route])
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def server():
    with Server(*SCRIPTED_GENERATION, "--generation.factory.step_time_s", "0.01") as srv:
        yield srv


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.route}:{sorted(r.body)}")
def test_the_table_matches_the_native_models(row: Row) -> None:
    assert native_accepts(row.route, row.body) is row.native
    assert (row.native == row.omni) == (row.why is None), "a difference needs its reason"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.route}:{sorted(r.body)}")
def test_omni_accepts_and_refuses_as_the_table_says(server: Server, row: Row) -> None:
    resp = httpx.post(f"{server.url}{row.route}", json=row.body, timeout=60)
    assert resp.status_code == (200 if row.omni else 400), resp.text
    if row.route == VIDEOS and resp.status_code == 200:
        httpx.delete(f"{server.url}/v1/videos/{resp.json()['id']}")


# --- the realtime video init -------------------------------------------------------------------
INIT_ROWS = [
    ({"type": "init", "prompt": "sea", "num_frames": 2, "max_chunks": 1, **SMALL}, True),
    ({"type": "init", "prompt": "sea", "num_frames": 2, "max_chunks": 1,
      "first_frame": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFk"
                     "lEQVR4nGPk5ORkYGBgYmBgYGBgAAABbgAfXn6dLgAAAABJRU5ErkJggg==",  # a 2x2 PNG
      **SMALL}, True),
    ({"type": "init"}, False),
    ({"type": "init", "prompt": "sea", "max_chunks": 0}, False),
    ({"type": "init", "prompt": 3}, False),
]


@pytest.mark.parametrize(("body", "accepted"), INIT_ROWS)
def test_realtime_init_like_the_native_model(server: Server, body: dict[str, Any],
                                             accepted: bool) -> None:
    model = getattr(importlib.import_module(PROTOCOL), "RealtimeVideoGenerationsRequest", None)
    if model is None or "type" not in model.model_fields:
        pytest.skip("this release's realtime request has no init type; see the README")
    try:
        model.model_validate(body)
        native = True
    except ValidationError:
        native = False
    assert native is accepted
    deadline = time.monotonic() + 15
    while True:
        with connect(server.url.replace("http", "ws") + "/v1/realtime_video/generate",
                     open_timeout=10) as conn:
            conn.send(msgpack.packb(body))
            first = msgpack.unpackb(conn.recv(timeout=30), raw=False)
        # the previous case's session holds the one realtime slot until the stage has ended
        # its aborted generation
        if first.get("content") != BUSY or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if accepted:
        assert first["type"] == "frame_batch", first
    else:
        assert first == {**first, "type": "error", "content": "invalid generate request"}


# --- the native route mapping ------------------------------------------------------------------
#: Native form fields Omni's routes do not serve, and why (each refused by name).
NOT_SERVED = {
    "generator_device": "Omni places the generation on its stage's device",
    "enable_teacache": "native cache acceleration is not exposed per request",
    "enable_cache_dit": "native cache acceleration is not exposed per request",
    "cache_dit_params": "native cache acceleration is not exposed per request",
    "profile": "native profiling writes server-side traces",
    "profile_all_stages": "native profiling writes server-side traces",
    "num_profiled_timesteps": "native profiling writes server-side traces",
    "x264_preset": "an image route encodes no video (the video route serves it)",
    "enhance_prompt": "Omni runs no prompt enhancer",
    "task_type": "the Cosmos3 task follows the request's media",
    "background": "Cosmos3 writes opaque PNG",
    "quality": "Cosmos3 has no quality presets", "output_quality": "Omni returns the PNG/MP4",
    "output_compression": "Omni returns the PNG/MP4", "output_path": "Omni owns output folders",
    "perf_dump_path": "no server-side files", "true_cfg_scale": "not a Cosmos3 option",
    "guidance_scale_2": "not a Cosmos3 option",
    "enable_frame_interpolation": "post-processing is not served",
    "frame_interpolation_exp": "post-processing is not served",
    "frame_interpolation_scale": "post-processing is not served",
    "frame_interpolation_model_path": "post-processing is not served",
    "enable_upscaling": "post-processing is not served",
    "upscaling_model_path": "post-processing is not served",
    "upscaling_scale": "post-processing is not served",
    "condition_frame_indexes": "Omni conditions on the reference's leading frames",
    "condition_frame_indexes_vision": "Omni conditions on the reference's leading frames",
    "condition_video_keep": "Omni conditions on the reference's leading frames",
    "action_fps": "forward dynamics uses the video fps",
    "action_view_point": "served on the action route", "action_stats_path": "server-side file",
    "action_normalization": "served on the action route",
}


def form_fields(module: str, name: str) -> set[str]:
    """The form fields a native route function declares (aliases such as ``image[]``)."""
    function = getattr(importlib.import_module(module), name)
    fields = set()
    for param in inspect.signature(function).parameters.values():
        default = param.default
        if param.name in ("request", "raw_request") or default is inspect.Parameter.empty:
            continue
        fields.add(str(getattr(default, "alias", None) or param.name))
    return fields


def test_every_native_video_form_field_is_served_or_refused_by_name() -> None:
    native = form_fields("sglang.multimodal_gen.runtime.entrypoints.openai.video_api",
                         "create_video")
    served = {*VIDEO_FIELDS, *VIDEO_OPTIONS, "extra_params", "extra_body"}
    assert {"prompt", "input_reference", "video_reference", "extra_params"} <= native
    assert native - served - set(NOT_SERVED) == set()


def test_every_native_edit_form_field_is_served_or_refused_by_name() -> None:
    native = form_fields("sglang.multimodal_gen.runtime.entrypoints.openai.image_api", "edits")
    served = {*EDIT_FIELDS, *IMAGE_OPTIONS, "image[]", "url[]", "extra_params", "extra_body"}
    assert {"prompt", "image", "url"} <= native
    assert native - served - set(NOT_SERVED) == set()
