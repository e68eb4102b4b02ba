"""Media checked where they enter, parsed beyond their leading bytes: real servers, real stage
processes, a real loopback media host.

Each way media enter (an inline ``data:`` URL, the action route's ``{"b64_json": ...}``, a
multipart upload, a remote fetch) gets the same bytes that are not what they claim: a PNG's
header followed by garbage, random bytes, gzip claiming to be a PNG, a truncated MP4, an MP4's
first box followed by garbage, random bytes claiming to be ``video/mp4``. A client's are a 400
naming the field, before any stage work; a media host's are a 500 (the host failed to send
media, spec 001's fetch rule) naming the field and the URL. Valid media still pass.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.generation.kit import scripted_server
from tests.kit import metric
from tests.media.media_http_server import PNG, MediaServer, bad_media, mp4_bytes
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server

BAD = sorted(bad_media())
BAD_IMAGES = [name for name in BAD if bad_media()[name][1].startswith("image/")]
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}
KIND = {"image/png": "image_url", "video/mp4": "video_url"}


@pytest.fixture(scope="module")
def umm() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "127.0.0.1") as srv:
        yield srv


@pytest.fixture(scope="module")
def direct() -> Iterator[Server]:
    with scripted_server("--generation.factory.step_time_s", "0.01") as srv:
        yield srv


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(server: Server, url: str, kind: str = "image_url") -> httpx.Response:
    script = json.dumps([{"action": "final", "text": "{media}"}])
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": f"<omni-script>{script}</omni-script>"},
        {"type": kind, kind: {"url": url}}]}]}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


def failed(resp: httpx.Response, status: int, *needles: str) -> str:
    assert resp.status_code == status, resp.text
    message = resp.json()["error"]["message"]
    for needle in needles:
        assert needle in message, message
    for leak in ("Errno", "Traceback", "object at 0x"):
        assert leak not in message, message
    return message


def submitted(server: Server, stage: str) -> float:
    return metric(server, stage, "submitted", default=0.0)


# --- inline data: URLs ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", BAD)
def test_inline_media_not_what_they_claim_are_400(umm: Server, name: str) -> None:
    data, mime = bad_media()[name]
    before = submitted(umm, "reasoner")
    failed(chat(umm, data_url(data, mime), KIND[mime]), 400,
           f"messages[0].content[1].{KIND[mime]}")
    assert submitted(umm, "reasoner") == before  # refused before any stage work


def test_valid_inline_media_pass(umm: Server) -> None:
    assert chat(umm, data_url(PNG, "image/png")).status_code == 200
    resp = chat(umm, data_url(mp4_bytes(), "video/mp4"), "video_url")
    assert resp.status_code == 200, resp.text


# --- remote fetches ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BAD)
def test_remote_media_not_what_they_claim_are_the_hosts_500(umm: Server, hosts: MediaServer,
                                                            name: str) -> None:
    mime = bad_media()[name][1]
    url = hosts.url("127.0.0.1", f"/bad/{name}")
    failed(chat(umm, url, KIND[mime]), 500, f"messages[0].content[1].{KIND[mime]}",
           f"fetching {url!r} failed", "the media host sent no readable image or video")


def test_valid_remote_media_pass(umm: Server, hosts: MediaServer) -> None:
    assert chat(umm, hosts.url("127.0.0.1", "/ok.png")).status_code == 200
    resp = chat(umm, hosts.url("127.0.0.1", "/ok.mp4"), "video_url")
    assert resp.status_code == 200, resp.text


def test_a_stage_that_fetches_checks_too(hosts: MediaServer) -> None:
    """The text-only Reasoner stage fetches remote media itself: the same 500."""
    with Server(*SCRIPTED_CHAT, "--allowed-media-domain", "127.0.0.1") as srv:
        for name in ("png-then-garbage", "truncated-mp4"):
            mime = bad_media()[name][1]
            failed(chat(srv, hosts.url("127.0.0.1", f"/bad/{name}"), KIND[mime]), 500,
                   f".content[1].{KIND[mime]}", "the media host sent no readable image")
        assert chat(srv, hosts.url("127.0.0.1", "/ok.png")).status_code == 200


# --- the action route's b64_json -----------------------------------------------------------------
def action(server: Server, image: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "pick up the cup", "image": image}, "parameters": DROID}, timeout=60)


@pytest.mark.parametrize("name", BAD)
def test_b64_json_not_an_image_is_400(direct: Server, name: str) -> None:
    data = bad_media()[name][0]
    before = submitted(direct, "generation")
    failed(action(direct, {"b64_json": base64.b64encode(data).decode()}), 400,
           "input.image.b64_json")
    failed(action(direct, {"b64_json": data_url(data, "image/png")}), 400,
           "input.image.b64_json")
    assert submitted(direct, "generation") == before


def test_b64_json_must_be_an_image_and_base64(direct: Server) -> None:
    failed(action(direct, {"b64_json": base64.b64encode(mp4_bytes()).decode()}), 400,
           "input.image.b64_json", "expected an image")
    failed(action(direct, {"b64_json": "not base64!"}), 400, "input.image.b64_json",
           "not valid base64")
    resp = action(direct, {"b64_json": base64.b64encode(PNG).decode()})
    assert resp.status_code == 200, resp.text


def test_a_realtime_actions_b64_json_is_checked_too(direct: Server) -> None:
    """``WS /v1/actions/realtime`` takes the same bodies: a b64_json image that is not one is
    the error message naming the field (native's error, then 1011)."""
    import msgpack
    from websockets.sync.client import connect

    bad = base64.b64encode(bad_media()["png-then-garbage"][0]).decode()
    body = {"input": {"task": "pick", "image": {"b64_json": bad}}, "parameters": DROID}
    with connect(direct.url.replace("http", "ws") + "/v1/actions/realtime",
                 open_timeout=10) as conn:
        conn.recv(timeout=30)  # the metadata
        conn.send(msgpack.packb(body))
        error = msgpack.unpackb(conn.recv(timeout=30), raw=False)
    assert error["code"] == 400 and "input.image.b64_json" in error["error"], error


# --- multipart uploads ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", BAD_IMAGES)
def test_uploaded_images_not_what_they_claim_are_400(direct: Server, name: str) -> None:
    data, mime = bad_media()[name]
    before = submitted(direct, "generation")
    resp = httpx.post(f"{direct.url}/v1/images/edits", data={"prompt": "cat", "size": "8x8"},
                      files={"image": ("a.png", data, mime)}, timeout=60)
    failed(resp, 400, "image")
    resp = httpx.post(f"{direct.url}/v1/actions/generations",
                      data={"prompt": "t", **{k: str(v) for k, v in DROID.items()}},
                      files={"image_reference": ("obs.png", data, mime)}, timeout=60)
    failed(resp, 400, "image")
    assert submitted(direct, "generation") == before


@pytest.mark.parametrize("name", [n for n in BAD if n not in BAD_IMAGES])
def test_uploaded_videos_not_what_they_claim_are_400(direct: Server, name: str) -> None:
    data, mime = bad_media()[name]
    resp = httpx.post(f"{direct.url}/v1/videos", data={"prompt": "more", "num_frames": "2"},
                      files={"video_reference": ("clip.mp4", data, mime)}, timeout=60)
    failed(resp, 400, "video_reference")


def test_valid_uploads_pass(direct: Server) -> None:
    resp = httpx.post(f"{direct.url}/v1/images/edits", data={"prompt": "cat", "size": "8x8"},
                      files={"image": ("a.png", PNG, "image/png")}, timeout=60)
    assert resp.status_code == 200, resp.text
    resp = httpx.post(f"{direct.url}/v1/videos", data={"prompt": "more", "num_frames": "2"},
                      files={"video_reference": ("clip.mp4", mp4_bytes(), "video/mp4")},
                      timeout=60)
    assert resp.status_code == 200, resp.text


def test_b64_json_over_the_per_file_limit_is_400(direct: Server) -> None:
    """A b64_json image is held to the per-file limit (native's media_url_max_file_size_mb,
    64 MiB) like a data: URL, before any stage work."""
    before = submitted(direct, "generation")
    over = "A" * ((64 * 1024 * 1024 // 3 + 1) * 4)  # 64 MiB + 3 bytes of base64
    failed(action(direct, {"b64_json": over}), 400, "input.image.b64_json",
           "larger than the 64 MB limit (media_url_max_file_size_mb)")
    assert submitted(direct, "generation") == before
