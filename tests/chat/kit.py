"""Helpers for the text-only chat tests: scripts, SSE parsing, a loopback media host."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from PIL import Image

from tests import kit
from tests.kit import metric as metric  # shared; re-exported for the chat tests
from tests.server import SCRIPTED_CHAT, Server

CHAT = "/v1/chat/completions"
TEXT_ONLY = [*SCRIPTED_CHAT, "--model-path", "/models/Cosmos3-Nano"]


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def script(*entries: Any) -> str:
    """:func:`tests.kit.script` with no text after the script."""
    return kit.script(*entries, tail="")


def say(text: str, **extra: Any) -> list[dict[str, Any]]:
    """A one-message conversation whose scripted answer is ``text`` (placeholders allowed)."""
    return [{"role": "user", "content": script({"action": "final", "text": text, **extra})}]


def sse_events(body: str) -> list[Any]:
    """The JSON data of every SSE event, ``[DONE]`` as the string."""
    return [data for _, data in kit.parse_sse(body)]


def streamed_text(body: str) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(body)
                   if isinstance(e, dict) and e.get("choices"))


def chat(server: Server, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{server.url}{CHAT}", json=body, timeout=timeout)


def answer(server: Server, body: dict[str, Any]) -> str:
    """The completion text of a request that must succeed, streaming or not."""
    resp = chat(server, body)
    assert resp.status_code == 200, resp.text
    if body.get("stream"):
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), resp.text
        return streamed_text(resp.text)
    return resp.json()["choices"][0]["message"]["content"]


@dataclass
class MediaHost:
    """A loopback HTTP host serving one PNG; ``paths`` lists what was fetched."""

    url: str
    paths: list[str] = field(default_factory=list)


@contextmanager
def media_host() -> Iterator[MediaHost]:
    body = png((10, 200, 10))
    host = MediaHost("")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            host.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    host.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield host
    finally:
        server.shutdown()
        server.server_close()
