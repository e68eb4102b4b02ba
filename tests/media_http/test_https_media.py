"""HTTPS media fetching end to end: a real server (scripted Reasoner, which fetches each media of
its conversation itself) and HTTPS media hosts on loopback whose certificates come from a
certificate authority the test makes (``trustme``), trusted by the server through
``SSL_CERT_FILE``. Covered: the connection goes to the checked (pinned) address while SNI and
the certificate check use the URL's host name; a certificate for another name, or from an
authority the server does not trust, fails the fetch saying so; redirects through TLS are
checked hop by hop (to another TLS host name, and off the allowlist)."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import trustme

from tests.media.media_http_server import PNG
from tests.server import SCRIPTED_UMM, Server

LABEL = ".content[1].image_url"


@dataclass
class Seen:
    """What the HTTPS hosts saw: the SNI name of each handshake, each request's Host and path."""

    sni: list[str | None] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            with seen.lock:
                seen.requests.append((self.headers.get("Host", ""), self.path))
            if self.path.startswith("/redirect?to="):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/redirect?to="))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200 if self.path == "/ok.png" else 404)
            body = PNG if self.path == "/ok.png" else b""
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@dataclass
class TLSHost:
    port: int
    seen: Seen
    server: ThreadingHTTPServer

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.port}{path}"


def _tls_host(cert: trustme.LeafCert) -> TLSHost:
    seen = Seen()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)

    def record(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        with seen.lock:
            seen.sni.append(name)

    context.sni_callback = record  # type: ignore[assignment]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(seen))
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return TLSHost(server.server_address[1], seen, server)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def hosts(ca: trustme.CA) -> Iterator[dict[str, TLSHost]]:
    """``localhost``: a certificate for localhost and 127.0.0.1; ``other``: one for
    ``media.other.test`` only; ``untrusted``: one for localhost from another authority."""
    made = {"localhost": _tls_host(ca.issue_cert("localhost", "127.0.0.1")),
            "other": _tls_host(ca.issue_cert("media.other.test")),
            "untrusted": _tls_host(trustme.CA().issue_cert("localhost"))}
    yield made
    for host in made.values():
        host.server.shutdown()
        host.server.server_close()


@pytest.fixture(scope="module")
def server(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    bundle = Path(tmp_path_factory.mktemp("ca")) / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "localhost",
                "--allowed-media-domain", "127.0.0.1",
                "--server.media_fetch_timeout_s", "5",
                env={"SSL_CERT_FILE": str(bundle)}) as srv:
        yield srv


def chat(server: Server, url: str) -> httpx.Response:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    content = [{"type": "text", "text": f"<omni-script>{script}</omni-script>"},
               {"type": "image_url", "image_url": {"url": url}}]
    return httpx.post(f"{server.url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": content}]}, timeout=60)


def fetched_png(resp: httpx.Response) -> None:
    assert resp.status_code == 200, resp.text
    text = resp.json()["choices"][0]["message"]["content"]
    assert hashlib.sha256(PNG).hexdigest() in text, text


def failed(resp: httpx.Response, status: int, *says: str) -> str:
    assert resp.status_code == status, resp.text
    message = resp.json()["error"]["message"]
    for needle in says:
        assert needle in message, message
    assert "Traceback" not in message and "SSLError" not in message
    return message


def test_a_host_name_is_fetched_over_tls_at_its_pinned_address(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    """``localhost`` resolves (once) to 127.0.0.1, where the connection goes; the TLS handshake
    still names and verifies ``localhost``, and Host says it too."""
    host = hosts["localhost"]
    fetched_png(chat(server, host.url("localhost", "/ok.png")))
    assert "localhost" in host.seen.sni
    assert (f"localhost:{host.port}", "/ok.png") in host.seen.requests


def test_an_ip_literal_is_verified_against_the_certificates_address(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    host = hosts["localhost"]
    before = len(host.seen.sni)
    fetched_png(chat(server, host.url("127.0.0.1", "/ok.png")))
    assert None in host.seen.sni[before:]  # no SNI for an address


def test_a_certificate_for_another_name_fails_the_fetch(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    host = hosts["other"]
    failed(chat(server, host.url("localhost", "/ok.png")), 500, LABEL,
           "TLS certificate did not verify")
    assert host.seen.requests == []  # nothing was asked of an unverified host


def test_a_certificate_from_an_untrusted_authority_fails_the_fetch(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    host = hosts["untrusted"]
    failed(chat(server, host.url("localhost", "/ok.png")), 500, "TLS certificate did not verify")
    assert host.seen.requests == []


def test_a_redirect_to_another_tls_host_is_verified_again(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    first, second = hosts["localhost"], hosts["other"]
    target = second.url("localhost", "/ok.png")  # the wrong certificate for this name
    failed(chat(server, first.url("localhost", f"/redirect?to={target}")), 500,
           "TLS certificate did not verify")
    assert second.seen.requests == []
    good = first.url("127.0.0.1", "/ok.png")
    fetched_png(chat(server, first.url("localhost", f"/redirect?to={good}")))


def test_a_redirect_off_the_allowlist_is_refused_before_connecting(
        server: Server, hosts: dict[str, TLSHost]) -> None:
    first, second = hosts["localhost"], hosts["other"]
    before = len(second.seen.sni)
    target = second.url("127.0.0.2", "/ok.png")
    failed(chat(server, first.url("localhost", f"/redirect?to={target}")), 400,
           "redirected to a refused URL", "127.0.0.2")
    assert len(second.seen.sni) == before
