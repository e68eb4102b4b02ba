"""The media policy through the HTTP routes: real servers, real stage processes, real loopback
media hosts (127.0.0.1 and 127.0.0.2 are different hosts)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kit import STAGE_SCRATCH, metric, wait_until
from tests.media.media_http_server import PNG, MediaServer
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("allowed")
    (root / "cube.png").write_bytes(PNG)
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.png").write_bytes(PNG)
    (root / "link.png").symlink_to(outside / "secret.png")
    return root


@pytest.fixture(scope="module")
def tmpdir_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-tmp")


@pytest.fixture(scope="module")
def server(media_root: Path, tmpdir_env: Path) -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "127.0.0.1",
                "--allowed-local-media-path", str(media_root),
                env={"TMPDIR": str(tmpdir_env)}) as srv:
        yield srv


def chat(server: Server, url: str, *entries: dict, timeout: float = 30) -> httpx.Response:
    script = json.dumps(list(entries) or [{"action": "final", "text": "{media}"}])
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": f"<omni-script>{script}</omni-script>"},
        {"type": "image_url", "image_url": {"url": url}}]}],
        "stage_params": {"generation": {"width": 32, "height": 32}}}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout)


def leftovers(folder: Path) -> list[str]:
    """What the server left in its ``TMPDIR``: the contents of each running stage's own
    temporary folder (``sgl-omni-<stage>-*``, there while the stage runs), everything else."""
    out = []
    for name in sorted(os.listdir(folder)):
        if STAGE_SCRATCH.match(name) and (folder / name).is_dir():
            out += [f"{name}/{inner}" for inner in sorted(os.listdir(folder / name))]
        else:
            out.append(name)
    return out


def test_allowed_host_is_fetched_once_per_request(server: Server, hosts: MediaServer,
                                               tmpdir_env: Path) -> None:
    hosts.state.reset()
    resp = chat(server, hosts.url("127.0.0.1", "/ok.png"),
                {"action": "image", "prompt": "cube"}, {"action": "final", "text": "{media}"})
    assert resp.status_code == 200, resp.text
    media = json.loads(resp.json()["choices"][0]["message"]["content"])
    assert media[0] == {"kind": "image", "sha256": hashlib.sha256(PNG).hexdigest()}
    assert len(media) == 2  # the client's image, then the generated one
    assert hosts.state.paths().count("/ok.png") == 1  # two Reasoner turns read one fetch
    assert leftovers(tmpdir_env) == []


def test_host_not_listed_refused_before_any_stage(server: Server, hosts: MediaServer) -> None:
    hosts.state.reset()
    before = metric(server, "reasoner", "submitted")
    resp = chat(server, hosts.url("127.0.0.2", "/ok.png"))
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert "messages[0].content[1].image_url" in message
    assert hosts.state.paths() == []
    assert metric(server, "reasoner", "submitted") == before


def test_redirect_to_unlisted_host_refused(server: Server, hosts: MediaServer) -> None:
    target = hosts.url("127.0.0.2", "/ok.png")
    resp = chat(server, hosts.url("127.0.0.1", f"/redirect?to={target}"))
    assert resp.status_code == 400
    assert "127.0.0.2" not in [h.split(":")[0] for h, _ in hosts.state.requests]


@pytest.mark.parametrize(("path", "status"), [("/missing", 400), ("/error", 500),
                                              ("/loop", 500), ("/endless", 500),
                                              ("/big-declared", 500), ("/gzip", 500)])
def test_fetch_failures_map_to_status(server: Server, hosts: MediaServer, tmpdir_env: Path,
                                      path: str, status: int) -> None:
    resp = chat(server, hosts.url("127.0.0.1", path))
    assert resp.status_code == status, resp.text
    assert leftovers(tmpdir_env) == []


#: Hosts that send more than native's 64 MiB media_url_max_file_size_mb: declared by
#: Content-Length, sent without one, and gzip that unpacks past it (with and without one).
OVER_THE_LIMIT = ["/big-declared", "/big-unsized", "/gzip-bomb", "/gzip-bomb?unsized"]
LIMIT = "64 MB limit (media_url_max_file_size_mb)"


def over_the_limit(resp: httpx.Response, label: str) -> None:
    assert resp.status_code == 500, resp.text
    message = resp.json()["error"]["message"]
    assert label in message and LIMIT in message, message


@pytest.mark.parametrize("path", OVER_THE_LIMIT)
def test_remote_media_over_the_limit_is_500_on_every_route(server: Server, hosts: MediaServer,
                                                           path: str) -> None:
    """Spec 001's fetch rule: a host that sends more than the limit fails (500), on the chat
    route and on /generate, naming the field and the limit; the body is cut off (the host's
    72 MiB never arrive whole: the fetch stops past 64 MiB)."""
    url = hosts.url("127.0.0.1", path)
    over_the_limit(chat(server, url), "messages[0].content[1].image_url")
    body = {"prompt": "x", "images": [url], "stage_params": {"generation": {"width": 32,
                                                                             "height": 32}}}
    over_the_limit(httpx.post(f"{server.url}/generate", json=body, timeout=60), "images[0]")


def test_a_fetch_the_stage_refuses_names_the_clients_message(server: Server,
                                                              hosts: MediaServer) -> None:
    # The Reasoner's messages start with Omni's instructions; the error names the client's
    # message, with a system message of the client's or without.
    resp = chat(server, hosts.url("127.0.0.1", "/missing"))
    assert resp.status_code == 400
    assert "messages[0].content[1].image_url" in resp.json()["error"]["message"], resp.text
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [
                             {"type": "image_url",
                              "image_url": {"url": hosts.url("127.0.0.1", "/missing")}}]}]}
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    assert "messages[1].content[0].image_url" in resp.json()["error"]["message"], resp.text


def test_local_files_confined(server: Server, media_root: Path) -> None:
    assert chat(server, f"file://{media_root / 'cube.png'}").status_code == 200
    assert chat(server, str(media_root / "cube.png")).status_code == 200
    for ref in (f"file://{media_root / 'link.png'}", f"file://{media_root}/../outside/x.png",
                "/etc/passwd", f"{media_root}/../../etc/passwd"):
        resp = chat(server, ref)
        assert resp.status_code == 400, ref


def test_generation_paths_follow_the_policy(server: Server, media_root: Path) -> None:
    before = metric(server, "reasoner", "submitted")
    body = {"prompt": "x", "stage_params": {"generation": {"image_path": "/etc/hosts"}}}
    resp = httpx.post(f"{server.url}/generate", json=body)
    assert resp.status_code == 400
    assert "stage_params.generation.image_path" in resp.json()["error"]["message"]
    assert metric(server, "reasoner", "submitted") == before


def test_aborted_fetch_leaves_no_temp_file(server: Server, hosts: MediaServer,
                                           tmpdir_env: Path) -> None:
    hosts.state.reset()
    before = metric(server, "reasoner", "submitted")
    with pytest.raises(httpx.ReadTimeout):
        chat(server, hosts.url("127.0.0.1", "/stall-body"), timeout=1.0)
    assert hosts.state.paths() == ["/stall-body"]  # the server was fetching it for its turn
    assert wait_until(lambda: Scrape(server).value("sgl_omni_interleaved_requests") == 0,
                      timeout=10)  # the client left: the request ended, its fetch cancelled
    assert leftovers(tmpdir_env) == []
    assert metric(server, "reasoner", "submitted") == before  # the turn never started


def test_text_only_chat_uses_the_same_policy(hosts: MediaServer) -> None:
    with Server(*SCRIPTED_CHAT, "--allowed-media-domain", "127.0.0.1") as srv:
        body = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": hosts.url("127.0.0.2", "/ok.png")}}]}]}
        resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body)
        assert resp.status_code == 400
        body["messages"][0]["content"][1]["image_url"]["url"] = "file:///etc/passwd"
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body).status_code == 400
        for path in OVER_THE_LIMIT:  # the text-only Reasoner stage fetches it itself
            body["messages"][0]["content"][1]["image_url"]["url"] = hosts.url("127.0.0.1", path)
            over_the_limit(httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60),
                           "messages[0].content[1].image_url")
