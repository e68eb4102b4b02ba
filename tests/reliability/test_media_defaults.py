"""A server with no media flags refuses a local path, a ``file:`` URL and a loopback URL
(``127.1``) with 400, and fetches nothing (tests/media_http/test_attacks.py covers every other
spelling, redirects, symlinks and slow hosts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.reliability.kit import SMALL, TrackedServer, error_shape_problem, script


@pytest.fixture(scope="module")
def media_host() -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP server that serves a PNG at every path; yields (port, paths fetched)."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = bytes.fromhex("89504e470d0a1a0a")
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], hits
    httpd.shutdown()
    httpd.server_close()


def refs(port: int) -> list[str]:
    return ["/etc/hostname", "file:///etc/hostname", f"http://127.1:{port}/x.png"]


def assert_refused(resp: httpx.Response, ref: str) -> None:
    assert resp.status_code == 400, f"{ref}: {resp.status_code} {resp.text[:300]}"
    assert error_shape_problem(resp.json()) is None, resp.text


PROMPT = script({"action": "final", "text": "{media}"})


def test_default_interleaved_server_refuses_local_and_loopback_media(
        umm: TrackedServer, media_host: tuple[int, list[str]]) -> None:
    port, hits = media_host
    for ref in refs(port):
        assert_refused(httpx.post(f"{umm.url}/generate", timeout=30, json={
            "prompt": PROMPT, "images": [ref], "stage_params": {"generation": SMALL}}), ref)
        assert_refused(httpx.post(f"{umm.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": PROMPT},
                {"type": "image_url", "image_url": {"url": ref}}]}]}), ref)
    assert hits == []


def test_default_text_chat_server_refuses_local_and_loopback_media(
        chat: TrackedServer, media_host: tuple[int, list[str]]) -> None:
    port, hits = media_host
    for ref in refs(port):
        assert_refused(httpx.post(f"{chat.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is it"},
                {"type": "image_url", "image_url": {"url": ref}}]}]}), ref)
    assert hits == []


def test_default_direct_server_refuses_local_and_loopback_media(
        direct: TrackedServer, media_host: tuple[int, list[str]]) -> None:
    port, hits = media_host
    for ref in refs(port):
        assert_refused(httpx.post(f"{direct.url}/v1/videos", timeout=30, json={
            "prompt": "a clip", "size": "32x32", "num_frames": 3, "input_reference": ref}), ref)
    assert hits == []
