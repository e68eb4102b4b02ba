"""Helpers for the direct generation tests: servers, metrics, waiting, video jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from sglang_omni.engines.synth_media import encode_png, frame_pixels
from tests import kit
from tests.kit import error_of as error_of  # shared helpers, re-exported for the generation tests
from tests.kit import png_size as png_size
from tests.kit import wait_for as wait_for
from tests.server import SCRIPTED_GENERATION, Server

HTTP = httpx.Client(timeout=60)
#: A small valid PNG the direct route tests send inline, upload and serve as a local file.
CAT_PNG = encode_png(frame_pixels("cat", 0, 8, 8, 0))
FAKE_DRIVER = "tests.generation.fake_diffusion:FakeDiffusion"


def metric(server: Server, outcome: str, stage: str = "generation") -> float:
    """:func:`tests.kit.metric` with the outcome first: the direct pipeline's one stage is
    generation."""
    return kit.metric(server, stage, outcome)


def wait_video(server: Server, video_id: str, timeout: float = 30) -> dict[str, Any]:
    """The job once its status is completed or failed."""
    job: dict[str, Any] = {}

    def done() -> bool:
        job.update(HTTP.get(f"{server.url}/v1/videos/{video_id}").json())
        return job["status"] in ("completed", "failed")

    wait_for(done, timeout)
    return job


def scripted_server(*flags: str, **kwargs: Any) -> Server:
    return Server(*SCRIPTED_GENERATION, *flags, **kwargs)


def native_server(log_dir: Path, output_dir: Path, *flags: str, env: dict[str, str] | None = None,
                  wait_ready: bool = True) -> Server:
    """A direct generation server whose stage runs the native engine over the fake driver."""
    return Server(*SCRIPTED_GENERATION, "--generation.gpu", "0",
                  "--generation.factory.backend", "native",
                  "--generation.factory.output_dir", str(output_dir),
                  "--model-path", "/models/cosmos3-nano", *flags,
                  env={"CUDA_VISIBLE_DEVICES": "0", "SGLANG_OMNI_DIFFUSION_DRIVER": FAKE_DRIVER,
                       "FAKE_DIFFUSION_LOG": str(log_dir), "SGLANG_PLUGINS": "",
                       **(env or {})},
                  wait_ready=wait_ready)


def cat_media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh media root holding ``cat.png`` (:data:`CAT_PNG`), for ``--server.media_roots``."""
    root = tmp_path_factory.mktemp("media")
    (root / "cat.png").write_bytes(CAT_PNG)
    return root


def ws(server: Server, path: str, **kwargs: Any) -> ClientConnection:
    """A WebSocket to ``path`` of ``server`` (the realtime routes)."""
    return connect(server.url.replace("http", "ws") + path, open_timeout=10, **kwargs)


def recv(conn: ClientConnection) -> dict[str, Any]:
    """The next realtime message, decoded from msgpack."""
    return msgpack.unpackb(conn.recv(timeout=30), raw=False, strict_map_key=False)


def closed_code(conn: ClientConnection) -> int | None:
    """Read until the server closes ``conn``; its close code."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            conn.recv(timeout=30)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None
