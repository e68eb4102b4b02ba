"""Media admission, one rule on every route, over HTTP, default media flags, each a 400 naming
the field before any stage runs, whether the route's stage would read the reference (the
Reasoner) or not (the scripted generation engine reads none: the direct routes answered 200):

* a media host name that resolves to loopback, or does not resolve at all;
* inline media whose bytes are no image or video, or not the type their data: URL declares
  (GIF bytes as image/png, random bytes as a video, an upload or a realtime first frame);
* a bare string that is a path but also valid base64 (``/dev/urandom``): the path refusal, not 9
  bytes of garbage handed to the Reasoner."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
from collections.abc import Callable, Iterator

import httpx
import msgpack
import pytest
from PIL import Image
from websockets.sync.client import connect

from tests.kit import metric
from tests.server import SCRIPTED_GENERATION, SCRIPTED_UMM, Server

#: A top-level domain that never resolves (RFC 2606).
UNRESOLVABLE = "media.invalid"


def _loopback_name() -> str | None:
    """This machine's host name when it resolves to loopback only (as in most containers, and
    as `vm` did in the report), else None."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        return None
    loopback = all(info[4][0].startswith("127.") or info[4][0] == "::1" for info in infos)
    return name if infos and loopback and "." not in name else None


LOOPBACK_NAME = _loopback_name()
HOSTS = [pytest.param(UNRESOLVABLE, "does not resolve", id="unresolvable"),
         pytest.param(LOOPBACK_NAME, "resolves to a loopback address", id="loopback-name",
                      marks=pytest.mark.skipif(LOOPBACK_NAME is None,
                                               reason="this host name is not loopback-only"))]
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


@pytest.fixture(scope="module")
def direct() -> Iterator[Server]:
    with Server(*SCRIPTED_GENERATION) as srv:
        yield srv


@pytest.fixture(scope="module")
def interleaved() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM) as srv:
        yield srv


def _chat(url: str) -> dict:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": f"<omni-script>{script}</omni-script>"},
        {"type": "image_url", "image_url": {"url": url}}]}]}


#: route -> (path, body for a media URL, the field the refusal names)
DIRECT: dict[str, tuple[str, Callable[[str], dict], str]] = {
    "edit": ("/v1/images/edits", lambda u: {"prompt": "p", "image": [u], "size": "32x32"},
             "image[0]"),
    "video": ("/v1/videos", lambda u: {"prompt": "p", "input_reference": u, "size": "32x32",
                                       "num_frames": 5}, "input_reference"),
    "action": ("/v1/actions/generations",
               lambda u: {"input": {"task": "t", "image": u}, "parameters": DROID}, "input.image"),
}
INTERLEAVED: dict[str, tuple[str, Callable[[str], dict], str]] = {
    "chat": ("/v1/chat/completions", _chat, "content[1].image_url"),
    "generate": ("/generate", lambda u: {"prompt": "hi", "images": [u]}, "images[0]"),
}


def _refused(server: Server, path: str, body: dict, field: str, says: str, stage: str) -> None:
    before = metric(server, stage, "submitted", default=0.0)
    resp = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert field in message and says in message, message
    assert metric(server, stage, "submitted", default=0.0) == before  # before any stage work


@pytest.mark.parametrize(("host", "says"), HOSTS)
@pytest.mark.parametrize("route", list(DIRECT))
def test_direct_routes_refuse_the_host(direct: Server, route: str, host: str, says: str) -> None:
    path, body, field = DIRECT[route]
    _refused(direct, path, body(f"http://{host}:9/x.png"), field, says, "generation")


@pytest.mark.parametrize(("host", "says"), HOSTS)
@pytest.mark.parametrize("route", list(INTERLEAVED))
def test_interleaved_routes_refuse_the_host(interleaved: Server, route: str, host: str,
                                            says: str) -> None:
    path, body, field = INTERLEAVED[route]
    _refused(interleaved, path, body(f"http://{host}:9/x.png"), field, says, "reasoner")


# --- inline content ------------------------------------------------------------------------------
def _gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buf, format="GIF")
    return buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


GIF = _gif()
NOISE = os.urandom(3 * 1024)
PATHS = ["/dev/urandom", "//etc/passwd"]  # valid base64 too


@pytest.mark.parametrize(("ref", "says"), [
    (f"data:image/png;base64,{_b64(GIF)}", "declares image/png but its bytes are image/gif"),
    (f"data:image/png;base64,{_b64(NOISE)}", "none of PNG"),
    (_b64(NOISE), "none of PNG"),
    *[(path, "reads no local files") for path in PATHS],
])
@pytest.mark.parametrize("route", list(DIRECT))
def test_direct_routes_check_inline_content(direct: Server, route: str, ref: str,
                                            says: str) -> None:
    path, body, field = DIRECT[route]
    _refused(direct, path, body(ref), field, says, "generation")


@pytest.mark.parametrize(("ref", "says"), [
    (f"data:image/png;base64,{_b64(GIF)}", "declares image/png but its bytes are image/gif"),
    (_b64(NOISE), "none of PNG"),
    *[(path, "reads no local files") for path in PATHS],
])
@pytest.mark.parametrize("route", list(INTERLEAVED))
def test_interleaved_routes_check_inline_content(interleaved: Server, route: str, ref: str,
                                                 says: str) -> None:
    path, body, field = INTERLEAVED[route]
    _refused(interleaved, path, body(ref), field, says, "reasoner")


def test_an_uploaded_video_of_random_bytes_is_refused(direct: Server) -> None:
    before = metric(direct, "generation", "submitted", default=0.0)
    resp = httpx.post(f"{direct.url}/v1/videos", data={"prompt": "p", "size": "32x32"},
                      files={"input_reference": ("clip.mp4", NOISE, "video/mp4")}, timeout=30)
    assert resp.status_code == 400, resp.text
    assert "input_reference" in resp.json()["error"]["message"]
    assert metric(direct, "generation", "submitted", default=0.0) == before


def test_a_gif_sent_as_png_still_generates_when_declared_right(direct: Server) -> None:
    """The check refuses a wrong claim, not a format: a GIF declared as one is read."""
    path, body, _ = DIRECT["edit"]
    resp = httpx.post(f"{direct.url}{path}", json=body(f"data:image/gif;base64,{_b64(GIF)}"),
                      timeout=30)
    assert resp.status_code == 200, resp.text


def test_a_realtime_first_frame_of_random_bytes_is_refused(direct: Server) -> None:
    with connect(direct.url.replace("http", "ws") + "/v1/realtime_video/generate",
                 open_timeout=10) as conn:
        conn.send(msgpack.packb({"type": "init", "prompt": "p", "size": "32x32",
                                 "num_frames": 3, "first_frame": NOISE}, use_bin_type=True))
        error = msgpack.unpackb(conn.recv(timeout=30), raw=False)
    assert error["type"] == "error" and error["content"] == "invalid generate request"
    assert error["error"]["message"].startswith("first_frame:"), error
    assert "none of PNG" in error["error"]["message"]
