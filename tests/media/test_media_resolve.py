"""Resolve once, check every address, connect to the checked address: DNS tricks cannot pass.

A fake resolver stands in for DNS (names under ``.test``); the media servers of ``conftest.py``
count every request, so "0 fetches" is observed, not assumed.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from pathlib import Path

import pytest

from sglang_omni.errors import MediaFetchFailed, MediaRefused
from sglang_omni.media import MediaPolicy, RequestMediaDir, fetch_remote, load_bytes
from sglang_omni.media.resolve import PinnedAddress, pinned_request
from sglang_omni.media.urls import parse_remote_url
from tests.media.media_http_server import PNG, MediaServer

LABEL = "images[0]"
PUBLIC = "93.184.216.34"  # a public address; nothing answers there in the test sandbox


class FakeDNS:
    """Answers each lookup with the next entry of ``answers`` (the last one repeats)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        index = min(len(self.calls), len(self.answers)) - 1
        return self.answers[index]


def fetch(url: str, policy: MediaPolicy, dns: FakeDNS) -> bytes:
    body = bytearray()

    async def go() -> None:
        await fetch_remote(parse_remote_url(url), policy, body.extend, label=LABEL, resolver=dns)

    asyncio.run(go())
    return bytes(body)


def quick(*hosts: str, **kw: object) -> MediaPolicy:
    return MediaPolicy(allowed_media_domains=hosts, fetch_timeout_s=0.5,  # type: ignore[arg-type]
                       fetch_deadline_s=2, **kw)


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["10.0.0.7"], ["::1"], ["169.254.169.254"],
                                    [PUBLIC, "127.0.0.1"], ["127.0.0.1", PUBLIC],
                                    ["::ffff:127.0.0.1"], ["0.0.0.0"]])
def test_name_resolving_to_a_non_public_address_refused(media_server: MediaServer,
                                                        answer: list[str]) -> None:
    dns = FakeDNS(answer)
    with pytest.raises(MediaRefused) as info:
        fetch(media_server.url("media.test", "/ok.png"), quick(), dns)
    assert info.value.status == 400 and LABEL in info.value.message
    assert "resolves to a" in info.value.message and "public address" in info.value.message
    assert "127.0.0.1" not in info.value.message  # internal DNS answers are not echoed
    assert dns.calls == ["media.test"]
    assert media_server.state.requests == []


def test_dns_rebinding_never_reaches_loopback(media_server: MediaServer) -> None:
    """Public to the check, loopback to any later lookup: there is no later lookup.

    The name is ``localhost``, which the *system* resolver answers with loopback, where the media
    server listens: had the HTTP client resolved the name again, the server would see a request.
    """
    dns = FakeDNS([PUBLIC], ["127.0.0.1"])
    with pytest.raises(MediaFetchFailed) as info:  # the public address does not answer here
        fetch(media_server.url("localhost", "/ok.png"), quick(), dns)
    assert info.value.status == 500
    assert dns.calls == ["localhost"]  # resolved once
    assert media_server.state.requests == []  # and connected only to the checked address


def test_pinned_request_keeps_host_and_tls_name() -> None:
    url = parse_remote_url("https://media.test:8443/a/b.png?x=1#f")
    pinned = pinned_request(url, PinnedAddress(ipaddress.ip_address(PUBLIC), 8443))
    assert pinned.url == f"https://{PUBLIC}:8443/a/b.png?x=1#f"
    assert pinned.headers == {"Host": "media.test:8443"}
    assert pinned.extensions == {"sni_hostname": "media.test"}
    v6 = pinned_request(parse_remote_url("http://media.test"),
                        PinnedAddress(ipaddress.ip_address("2001:db8::1"), 80))
    assert v6.url == "http://[2001:db8::1]:80" and v6.headers == {"Host": "media.test"}
    assert v6.extensions == {}


def test_allowlisted_name_may_resolve_private_and_is_pinned(media_server: MediaServer) -> None:
    dns = FakeDNS(["127.0.0.1"], [PUBLIC])
    assert fetch(media_server.url("store.test", "/ok.png"), quick("store.test"), dns) == PNG
    assert dns.calls == ["store.test"]
    assert media_server.state.requests == [(f"store.test:{media_server.port}", "/ok.png")]


def test_unreachable_first_address_falls_back_to_the_next(media_server: MediaServer) -> None:
    dns = FakeDNS(["127.0.0.3", "127.0.0.1"])  # nothing listens on 127.0.0.3
    assert fetch(media_server.url("store.test", "/ok.png"), quick("store.test"), dns) == PNG


class NoDNS(FakeDNS):
    """A resolver failing with ``getaddrinfo``'s ``error``."""

    def __init__(self, error: int) -> None:
        super().__init__()
        self.error = error

    async def __call__(self, host: str, port: int) -> list[str]:
        raise socket.gaierror(self.error, "Name or service not known (secret detail)")


def test_unresolvable_name_is_the_clients_400_without_internals(
        media_server: MediaServer) -> None:
    """A name with no address: the client named it (the same 400 as at admission)."""
    with pytest.raises(MediaRefused) as info:
        fetch(media_server.url("nowhere.test", "/ok.png"), quick(), NoDNS(socket.EAI_NONAME))
    assert info.value.status == 400 and "does not resolve" in info.value.message
    assert "secret detail" not in info.value.message


def test_a_failing_name_service_is_500(media_server: MediaServer) -> None:
    with pytest.raises(MediaFetchFailed) as info:
        fetch(media_server.url("nowhere.test", "/ok.png"), quick(), NoDNS(socket.EAI_AGAIN))
    assert info.value.status == 500 and "could not be resolved now" in info.value.message
    assert "secret detail" not in info.value.message


def test_redirect_to_a_listed_name_is_resolved_and_pinned_again(
        media_server: MediaServer) -> None:
    dns = FakeDNS(["127.0.0.2"])
    to = media_server.url("store.test", "/ok.png")
    ref = media_server.url("127.0.0.1", f"/redirect?to={to}")
    assert fetch(ref, quick("127.0.0.1", "store.test"), dns) == PNG
    assert dns.calls == ["store.test"]
    assert [h for h, _ in media_server.state.requests] == [
        f"127.0.0.1:{media_server.port}", f"store.test:{media_server.port}"]


# --- bytes per request ---------------------------------------------------------------------------
def test_media_bytes_limit_counts_all_parts_of_a_request(media_server: MediaServer,
                                                         tmp_path: Path) -> None:
    pol = quick("127.0.0.1", max_media_bytes=2 * len(PNG) + 10)
    inline = "data:image/png;base64," + base64.b64encode(b"x" * 20).decode()

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            url = media_server.url("127.0.0.1", "/ok.png")
            assert await load_bytes(url, pol, workdir, label="images[0]") == PNG
            assert await load_bytes(url, pol, workdir, label="images[1]") == PNG
            with pytest.raises(MediaRefused) as info:  # 2 PNGs + 20 bytes > the limit
                await load_bytes(inline, pol, workdir, label="images[2]")
            assert info.value.status == 400
            assert info.value.message.startswith("images[2]: ")
            assert f"--server.max_media_bytes {2 * len(PNG) + 10}" in info.value.message
        async with RequestMediaDir(tmp_path) as workdir:  # a new request starts from zero
            assert await load_bytes(url, pol, workdir, label="images[0]") == PNG

    asyncio.run(go())


def test_media_bytes_limit_stops_an_endless_body(media_server: MediaServer,
                                                 tmp_path: Path) -> None:
    pol = quick("127.0.0.1", max_media_bytes=50_000, max_file_size_mb=0)

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            with pytest.raises(MediaRefused, match="max_media_bytes 50000"):
                await load_bytes(media_server.url("127.0.0.1", "/endless"), pol, workdir,
                                 label=LABEL)
            with pytest.raises(MediaRefused, match="max_media_bytes"):  # declared up front
                await load_bytes(media_server.url("127.0.0.1", "/big-declared"), pol, workdir,
                                 label=LABEL)

    asyncio.run(go())
    assert media_server.state.endless_done.wait(5)
    assert media_server.state.endless_sent < 1024 * 1024
