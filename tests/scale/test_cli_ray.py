"""``sgl-omni serve --ray`` joins a cluster (``--ray-address``), serves the pipeline on
``--replicas`` replicas behind Ray's proxy, and removes its application on SIGTERM;
``sgl-omni replicas`` lists them. Configuration errors stop it before Ray is touched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.kit import script

ROOT = Path(__file__).parent.parent.parent
SCRIPTED = str(ROOT / "configs" / "cpu-scripted.yaml")


def sgl_omni(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_omni", *args], capture_output=True,
                          text=True, timeout=timeout)


def list_replicas(address: str, expected: int, within_s: float = 60,
                  showing: str = "") -> subprocess.CompletedProcess[str]:
    """``sgl-omni replicas`` until it lists ``expected`` replicas, each answering ok, with
    ``showing`` in its output (a loaded machine may be slow to answer a fleet read, and a
    replica's stats lag its answers) or ``within_s`` passes; the last run either way."""
    deadline = time.monotonic() + within_s
    while True:
        listed = sgl_omni("replicas", "--ray-address", address)
        lines = listed.stdout.strip().splitlines()
        if (listed.returncode == 0 and len(lines) == expected
                and all(" ok: " in line for line in lines) and showing in listed.stdout) \
                or time.monotonic() > deadline:
            return listed
        time.sleep(1)


@pytest.mark.parametrize(("flags", "message"), [
    (["--config", SCRIPTED, "--nope.gpu", "1"], "stages.nope"),
    (["--demo"], "--demo and --ray"),
    (["--config", SCRIPTED, "--replicas", "0"], "--replicas"),
])
def test_configuration_errors_exit_2_before_ray(flags: list[str], message: str) -> None:
    done = sgl_omni("serve", "--ray", *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.timeout(600)  # its own waits (90 s ready, 60 s listed, 60 s stopped) and the
# cluster's start when it is the worker's first fleet test (tests/scale/conftest.py)
def test_serve_ray_joins_the_cluster_and_cleans_up(cluster) -> None:  # type: ignore[no-untyped-def]
    from ray import serve

    from tests.scale.kit import with_delete

    with_delete()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_omni", "serve", "--config", SCRIPTED, "--ray",
         "--replicas", "2", "--ray-address", cluster.address, "--host", "127.0.0.1",
         "--port", str(cluster.port), "--model-name", "cosmos3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"{cluster.url}/v1/models", timeout=2).json()["data"][0][
                    "id"] == "cosmos3"
            except (httpx.HTTPError, KeyError, ValueError):
                ready = False
            if ready:
                break
            time.sleep(0.5)
        assert ready, proc.stdout.read() if proc.poll() is not None else "not ready"
        body = {"prompt": script({"action": "image", "prompt": "a cube"},
                                 {"action": "final", "text": "ok"}),
                "stage_params": {"generation": {"width": 32, "height": 32}}}
        assert httpx.post(f"{cluster.url}/generate", json=body, timeout=30).status_code == 200
        listed = list_replicas(cluster.address, expected=2, showing="generations 1")
        lines = listed.stdout.strip().splitlines()
        assert listed.returncode == 0 and len(lines) == 2, listed.stdout + listed.stderr
        assert all(" ok: " in line for line in lines) and "generations 1" in listed.stdout, \
            listed.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "omni" not in serve.status().applications


@pytest.mark.parametrize("command", [["serve", "--config", SCRIPTED, "--ray"], ["replicas"]])
def test_a_cluster_that_wants_a_token_is_named_at_once(command: list[str]) -> None:
    """A cluster with token authentication (Ray 2.60's default where a token exists) refuses a
    process joining by address without RAY_AUTH_MODE=token: the command says what to set and
    exits 2 at once, where ray.init retried for 20 s. The cluster's GCS answers as Ray's does
    (an UNAUTHENTICATED status to its first RPC)."""
    pytest.importorskip("ray")
    from concurrent import futures

    import grpc
    from ray.core.generated import gcs_service_pb2_grpc

    class Refusing(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "InvalidAuthToken: Authentication token is missing or incorrect")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        began = time.monotonic()
        done = sgl_omni(*command, "--ray-address", f"127.0.0.1:{port}", timeout=60)
        took = time.monotonic() - began
    finally:
        server.stop(None)
    assert done.returncode == 2, done.stderr
    assert "requires token authentication" in done.stderr and "RAY_AUTH_MODE=token" in \
        done.stderr, done.stderr
    assert took < 15, took  # the interpreter's start and imports, not Ray's 20 s of retries
