"""A model package outside Omni (``tests.toy_model``) serves through Omni's routes with the
scripted engines, registered by its ``sglang_omni.models`` entry point (a distribution's
metadata on the server's path, :mod:`tests.toy_model.distribution`) or named by the config's
``model_packages``, with no change to Omni: its adapter's decision format
and prompts drive the interleaved request, and its own limits (no side over 512, sides in
multiples of 32) are the ones the routes apply, where Cosmos3's would take the same sizes."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kit import error_message, png_size, script, wait_for
from tests.server import Server, free_port, kill_own_group
from tests.toy_model.distribution import pythonpath_with, write_distribution

HERE = Path(__file__).parent
HTTP = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the toy model's distribution metadata (its entry point)."""
    return write_distribution(tmp_path_factory.mktemp("toy-site"))


@pytest.fixture(scope="module")
def toy_umm(toy_site: Path) -> Iterator[Server]:
    """Named by model_packages (the documented config) and found by its entry point too: it
    registers once."""
    server = Server("--config", str(HERE / "toy-umm-scripted.yaml"),
                    env={"PYTHONPATH": pythonpath_with(toy_site)})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def toy_direct(toy_site: Path) -> Iterator[Server]:
    """The toy's direct config names no model package: the entry point alone registers it."""
    server = Server("--config", str(HERE / "toy-direct-scripted.yaml"),
                    env={"PYTHONPATH": pythonpath_with(toy_site)})
    try:
        yield server
    finally:
        server.stop()


def test_server_info_names_the_toy_pipeline(toy_umm: Server) -> None:
    info = HTTP.get(f"{toy_umm.url}/server_info").json()
    assert info["pipeline"] == "ToyUMMPipelineConfig"


def test_interleaved_generate_runs_the_toy_adapter(toy_umm: Server) -> None:
    prompt = script({"action": "image", "prompt": "a toy cube"},
                    {"action": "final", "text": "saw: {last}"})
    body = {"prompt": prompt, "stage_params": {"generation": {"width": 96, "height": 64}}}
    resp = HTTP.post(f"{toy_umm.url}/generate", json=body)
    assert resp.status_code == 200, resp.text
    segments = resp.json()["segments"]
    assert [s["kind"] for s in segments] == ["image", "text"], segments
    assert png_size(base64.b64decode(segments[0]["data"]["url"].split(",", 1)[1])) == (96, 64)
    # the toy's own prompts reached its Reasoner, and its decision format came back
    assert segments[1]["data"] == "saw: Toy turn: 1 toy generation(s) left."


def test_interleaved_chat_takes_the_toy_default_size(toy_umm: Server) -> None:
    prompt = script({"action": "image", "prompt": "a toy ball"}, {"action": "final", "text": "ok"})
    resp = HTTP.post(f"{toy_umm.url}/v1/chat/completions",
                     json={"messages": [{"role": "user", "content": prompt}]})
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert message["content"] == "ok"
    segments = message["segments"]
    assert [s["kind"] for s in segments] == ["image", "text"], segments
    assert png_size(base64.b64decode(segments[0]["data"]["url"].split(",", 1)[1])) == (256, 256)


@pytest.mark.parametrize(("generation", "expected"), [
    ({"width": 1024, "height": 512}, "over the Toy's largest side of 512"),
    ({"width": 100, "height": 64}, "needs a multiple of 32, got 100"),
])
def test_interleaved_limits_are_the_toy_models(toy_umm: Server, generation: dict,
                                               expected: str) -> None:
    body = {"prompt": script({"action": "final", "text": "x"}),
            "stage_params": {"generation": generation}}
    resp = HTTP.post(f"{toy_umm.url}/generate", json=body)
    assert resp.status_code == 400, resp.text
    assert expected in error_message(resp)
    assert error_message(resp).startswith("stage_params.generation.width")


def test_direct_image_is_made_within_the_toy_limits(toy_direct: Server) -> None:
    resp = HTTP.post(f"{toy_direct.url}/v1/images/generations",
                     json={"prompt": "a toy", "size": "64x96"})
    assert resp.status_code == 200, resp.text
    assert png_size(base64.b64decode(resp.json()["data"][0]["b64_json"])) == (64, 96)


@pytest.mark.parametrize(("size", "expected"), [
    ("640x640", "width: 640, over the Toy's largest side of 512"),
    ("48x64", "width: the generation engine needs a multiple of 32, got 48"),
])
def test_direct_image_over_the_toy_limits_is_refused(toy_direct: Server, size: str,
                                                     expected: str) -> None:
    resp = HTTP.post(f"{toy_direct.url}/v1/images/generations",
                     json={"prompt": "a toy", "size": size})
    assert resp.status_code == 400, resp.text
    assert expected in error_message(resp)


def test_the_action_route_asks_the_toy_model(toy_direct: Server) -> None:
    """The toy model answers no actions: its own refusal, and its metadata lists no mode."""
    resp = HTTP.post(f"{toy_direct.url}/v1/actions/generations",
                     json={"prompt": "pick", "domain_name": "toy"})
    assert resp.status_code == 400, resp.text
    assert "the Toy model answers no action requests" in error_message(resp)
    meta = HTTP.get(f"{toy_direct.url}/v1/actions/metadata").json()
    assert meta["capabilities"]["action_modes"] == []


ROOT = HERE.parents[1]
#: The console script pip installs beside the interpreter (``[project.scripts]``).
CONSOLE_SCRIPT = Path(sys.executable).parent / "sgl-omni"


@pytest.mark.server
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the sgl-omni console script is not "
                    "installed beside this interpreter")
def test_the_documented_toy_command_runs_under_the_console_script(tmp_path: Path) -> None:
    """docs/configuration.md's command, as written, from the repository root: the console
    script has no current directory on its path, so ``tests.toy_model`` was "cannot import"
    (exit 2) there while ``python -m sglang_omni`` found it. The package under test is put on
    the path alone (a link to it), never the repository root."""
    command = ".venv/bin/sgl-omni serve --config tests/toy_model/toy-umm-scripted.yaml " \
        "--port 8000"
    assert command in (ROOT / "docs" / "configuration.md").read_text()
    (tmp_path / "sglang_omni").symlink_to(ROOT / "sglang_omni")
    port = free_port()
    args = [str(CONSOLE_SCRIPT), *command.split()[1:-1], str(port)]
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return HTTP.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60)
        models = HTTP.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["id"] == "ToyUMMPipelineConfig"
    finally:
        kill_own_group(proc, signal.SIGTERM)
        proc.wait(30)
