"""A loopback media host whose answers wait at a gate the test opens, for the budget and
concurrency tests: it records every path asked for, how many requests it holds at once (and the
most it ever held), and answers ``/gate/<name>`` with a PNG only once :attr:`GateHost.open` is
set (``/fail/<name>`` answers 500 at once). Nothing here measures time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.media.media_http_server import PNG


@dataclass
class GateHost:
    """What the host saw, and its gate."""

    port: int = 0
    paths: list[str] = field(default_factory=list)
    waiting: int = 0
    most_waiting: int = 0
    open: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def reset(self) -> None:
        with self.changed:
            self.paths.clear()
            self.most_waiting = 0
            self.open.clear()

    def wait(self, predicate: object, timeout: float = 60) -> bool:
        """Whether ``predicate(self)`` held within ``timeout`` (woken by each request)."""
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self), timeout)  # type: ignore[operator]

    def seen(self, path: str) -> bool:
        with self.changed:
            return path in self.paths


class _Handler(BaseHTTPRequestHandler):
    host: GateHost

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        host = self.host
        with host.changed:
            host.paths.append(self.path)
            host.changed.notify_all()
        if self.path.startswith("/fail/"):
            self._answer(500, b"boom")
            return
        with host.changed:
            host.waiting += 1
            host.most_waiting = max(host.most_waiting, host.waiting)
            host.changed.notify_all()
        try:
            while not host.open.wait(0.05):
                if host.stop.is_set():
                    return
            self._answer(200, PNG, "image/png")
        except OSError:
            pass  # the client left
        finally:
            with host.changed:
                host.waiting -= 1
                host.changed.notify_all()

    def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def gate_host() -> Iterator[GateHost]:
    """The host on 127.0.0.1, serving until the block ends."""
    host = GateHost()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"host": host}))
    server.daemon_threads = True
    host.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield host
    finally:
        host.stop.set()
        server.shutdown()
        server.server_close()
