"""Attacks on the media policy over HTTP: real servers, real stage processes, real media hosts.

The media hosts listen on 127.0.0.1 and 127.0.0.2 and log every request, so "0 fetches of a
refused resource" is observed. Two servers:

* ``default``: no media flags at all (the secure default), ``--server.max_media_parts 3``;
* ``guarded``: ``--allowed-media-domain 127.0.0.1`` (the test host is allowlisted, which is how
  an operator allows an internal store), ``--allowed-local-media-path ROOT``, a small
  ``--server.max_media_bytes`` and short media fetch timeouts.

DNS rebinding needs control of DNS and is covered with an injected resolver in
``tests/media/test_media_resolve.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kit import metric, wait_for
from tests.media.media_http_server import PNG, MediaServer
from tests.server import SCRIPTED_UMM, Server

#: The refused field. (Refusals from a stage name the message index of the Reasoner's
#: conversation, which starts with the adapter's system message, so the index is left out.)
LABEL = ".content[1].image_url"
MAX_MEDIA_BYTES = 200_000

#: Spellings of this machine's loopback (where the media host listens) and other non-public
#: hosts. Each must be refused before any fetch.
LOOPBACK_SPELLINGS = [
    "127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f.0.0.1", "0x7f.1", "0x7f000001",
    "0177.0.0.1", "017700000001", "127.0.0.1.", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:7f00:1]", "[::1]", "0.0.0.0", "0", "[::]", "localhost", "LocalHost.",
    "media.localhost", "127.0.0.2", "[fe80::1%25lo]", "[::1%251]",
]  # fmt: skip
OTHER_NON_PUBLIC = ["10.0.0.1", "172.16.0.1", "192.168.0.1", "169.254.169.254", "100.64.0.1",
                    "224.0.0.1", "[fc00::1]", "[fe80::1]", "[2002:7f00:1::]"]


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("attack")
    root, outside = base / "allowed", base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "cube.png").write_bytes(PNG)
    (outside / "secret.png").write_bytes(PNG)
    (base / "allowed-evil").mkdir()
    (base / "allowed-evil" / "secret.png").write_bytes(PNG)
    (root / "link.png").symlink_to(outside / "secret.png")
    (root / "link_dir").symlink_to(outside)
    (root / "sub" / "up").symlink_to("../..")
    return root


@pytest.fixture(scope="module")
def default() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--server.max_media_parts", "3") as srv:
        yield srv


@pytest.fixture(scope="module")
def guarded(media_root: Path) -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "127.0.0.1",
                "--allowed-local-media-path", str(media_root),
                "--server.max_media_bytes", str(MAX_MEDIA_BYTES),
                "--server.media_fetch_timeout_s", "1",
                "--server.media_fetch_deadline_s", "2") as srv:
        yield srv


def submitted(server: Server) -> float:
    return metric(server, "reasoner", "submitted", default=0.0)


def chat(server: Server, *urls: str, timeout: float = 30, **extra: object) -> httpx.Response:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    content: list[dict] = [{"type": "text", "text": f"<omni-script>{script}</omni-script>"}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    body = {"messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout)


def refused(resp: httpx.Response, *needles: str, status: int = 400) -> str:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == status
    for needle in needles:
        assert needle in error["message"], error["message"]
    for leak in ("Errno", "Traceback", "httpx", "ConnectError("):
        assert leak not in error["message"], error["message"]
    return error["message"]


def data_url(size: int) -> str:
    """A data: URL of ``size`` bytes (at least ``len(PNG)``): a real PNG, then zeros after its
    end (admission parses the image; decoders ignore what follows it)."""
    return "data:image/png;base64," + base64.b64encode(PNG + bytes(size - len(PNG))).decode()


# --- addresses ---------------------------------------------------------------------------------
@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS + OTHER_NON_PUBLIC)
def test_non_public_hosts_refused_by_default_with_no_fetch(
        default: Server, hosts: MediaServer, host: str) -> None:
    hosts.state.reset()
    before = submitted(default)
    port = f":{hosts.port}" if host in LOOPBACK_SPELLINGS else ""
    refused(chat(default, f"http://{host}{port}/secret"), LABEL)
    assert hosts.state.requests == []
    assert submitted(default) == before  # refused before any stage work


@pytest.mark.parametrize("host", [h for h in LOOPBACK_SPELLINGS
                                  if h not in ("127.0.0.1", "127.0.0.1.")])  # the same host
def test_other_spellings_of_an_allowlisted_address_refused(
        guarded: Server, hosts: MediaServer, host: str) -> None:
    hosts.state.reset()
    refused(chat(guarded, f"http://{host}:{hosts.port}/secret"), LABEL)
    assert hosts.state.requests == []


def test_allowlisted_host_may_be_private(guarded: Server, hosts: MediaServer) -> None:
    hosts.state.reset()
    resp = chat(guarded, hosts.url("127.0.0.1", "/ok.png"))
    assert resp.status_code == 200, resp.text
    assert hosts.state.paths() == ["/ok.png"]


@pytest.mark.parametrize("target", [
    "http://127.0.0.2:{port}/secret", "http://127.1:{port}/secret",
    "http://2130706433:{port}/secret", "http://[::ffff:127.0.0.1]:{port}/secret",
    "http://[::1]:{port}/secret", "http://localhost:{port}/secret",
    "http://0.0.0.0:{port}/secret", "http://169.254.169.254/latest/meta-data/",
    "file:///etc/passwd", "gopher://127.0.0.1:{port}/secret",
])
def test_redirect_off_the_allowlist_never_fetched(guarded: Server, hosts: MediaServer,
                                                  target: str) -> None:
    hosts.state.reset()
    to = target.format(port=hosts.port)
    for code in (302, 307):
        message = refused(chat(guarded, hosts.url("127.0.0.1", f"/redirect?code={code}&to={to}")),
                          LABEL, "redirected to a refused URL")
        assert "Location" not in message
    assert [p.split("?")[0] for p in hosts.state.paths()] == ["/redirect", "/redirect"]


# --- local files -------------------------------------------------------------------------------
def test_no_flags_means_no_local_file(default: Server, media_root: Path) -> None:
    before = submitted(default)
    for ref in ("/etc/passwd", "/etc/hostname", "README.md", "./pyproject.toml",
                str(media_root / "cube.png"), f"file://{media_root}/cube.png",
                "file:///etc/passwd", str(media_root)):
        refused(chat(default, ref), LABEL, "--allowed-local-media-path")
    assert submitted(default) == before


@pytest.mark.parametrize("ref", [
    "file://{root}/link.png", "file://{root}/link_dir/secret.png", "{root}/link.png",
    "file://{root}/../outside/secret.png", "file://{root}/%2e%2e/outside/secret.png",
    "file://{root}/sub/up/outside/secret.png", "{root}/sub/../../outside/secret.png",
    "{root}-evil/secret.png", "file://{root}/../allowed-evil/secret.png", "/etc/passwd",
    "file:///proc/self/environ",
])
def test_symlink_and_dotdot_escapes_refused(guarded: Server, media_root: Path, ref: str) -> None:
    before = submitted(guarded)
    refused(chat(guarded, ref.format(root=media_root)), LABEL,
            "outside --allowed-local-media-path")
    assert submitted(guarded) == before


def test_inside_the_folder_is_served(guarded: Server, media_root: Path) -> None:
    for ref in (f"file://{media_root}/cube.png", f"{media_root}/sub/../cube.png"):
        assert chat(guarded, ref).status_code == 200


@pytest.mark.parametrize("ref", ["{root}", "{root}/sub", "file://{root}/sub/", "{root}/sub/up/"
                                 "allowed"])
def test_directory_is_a_400_naming_the_field(guarded: Server, media_root: Path, ref: str) -> None:
    refused(chat(guarded, ref.format(root=media_root)), LABEL, "is a directory")


def test_missing_file_is_a_400(guarded: Server, media_root: Path) -> None:
    refused(chat(guarded, f"file://{media_root}/nope.png"), LABEL, "no such file")


# --- hostile media hosts -----------------------------------------------------------------------
def test_oversize_media_host_cut_off_at_the_request_limit(guarded: Server,
                                                          hosts: MediaServer) -> None:
    hosts.state.reset()
    refused(chat(guarded, hosts.url("127.0.0.1", "/endless")), LABEL,
            f"--server.max_media_bytes {MAX_MEDIA_BYTES}")
    assert hosts.state.endless_done.wait(10), "the media host kept sending"
    assert hosts.state.endless_sent < 4 * 1024 * 1024  # the fetch hung up near the limit
    refused(chat(guarded, hosts.url("127.0.0.1", "/big-declared")), LABEL,
            "larger than the 64 MB limit (media_url_max_file_size_mb)", status=500)


def test_compressed_media_is_the_hosts_500(guarded: Server, hosts: MediaServer) -> None:
    """A media host that sends Content-Encoding: gzip though the fetch asked for none fails the
    fetch (spec 001: 500 when the host fails or sends more than the limit)."""
    refused(chat(guarded, hosts.url("127.0.0.1", "/gzip")), LABEL, "compressed body",
            "media_url_max_file_size_mb", status=500)


def test_slowloris_media_host_hits_the_fetch_deadline(guarded: Server,
                                                      hosts: MediaServer) -> None:
    """One byte every 0.2 s never trips the 1 s stall timeout: only the 2 s deadline on the
    whole fetch ends it, the fetch hanging up on the host (which would take ~15 s to finish)."""
    hosts.state.reset()
    message = refused(chat(guarded, hosts.url("127.0.0.1", "/slowloris"), timeout=14), LABEL,
                      status=500)
    assert "took longer than 2 s" in message
    wait_for(lambda: "/slowloris" in hosts.state.ended, timeout=20)
    assert hosts.state.ended["/slowloris"] == "hung up"


def test_stalled_media_host_times_out(guarded: Server, hosts: MediaServer) -> None:
    message = refused(chat(guarded, hosts.url("127.0.0.1", "/stall-headers"), timeout=14),
                      LABEL, status=500)
    assert "timed out (no progress for 1 s)" in message


def test_unreachable_media_host_is_a_clean_500(guarded: Server) -> None:
    refused(chat(guarded, "http://127.0.0.1:1/x.png"), LABEL, "cannot connect", status=500)


# --- limits ------------------------------------------------------------------------------------
def test_media_parts_over_the_limit_refused(default: Server) -> None:
    image = data_url(len(PNG))
    assert chat(default, image, image, image).status_code == 200
    before = submitted(default)
    refused(chat(default, image, image, image, image), "messages[0].content[4].image_url",
            "4 media references", "--server.max_media_parts 3")
    refused(chat(default, image, image, image, images=[image]), "images[0]",
            "--server.max_media_parts 3")
    body = {"prompt": "x", "images": [image] * 3,
            "stage_params": {"generation": {"image_path": image}}}
    refused(httpx.post(f"{default.url}/generate", json=body, timeout=30),
            "--server.max_media_parts 3")
    assert submitted(default) == before


def test_inline_media_bytes_over_the_limit_refused(guarded: Server) -> None:
    big = data_url(MAX_MEDIA_BYTES // 2 + 1)
    before = submitted(guarded)
    refused(chat(guarded, big, big), "messages[0].content[2].image_url",
            f"--server.max_media_bytes {MAX_MEDIA_BYTES}")
    assert submitted(guarded) == before
