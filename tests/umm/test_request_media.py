"""A request's media cross to the Reasoner stage once (issue 25, item 2), over real server and
stage processes with the scripted engines: every turn still reads every media item of the
request in order (each generation's prompt is the ``{media}`` its turn read, and the scripted
generator's pixels are a function of its prompt), a remote chat image is fetched once per
request, the bytes sent to the Reasoner stage (``sgl_omni_stage_sent_bytes_total``) grow with
the request's media, not with turns times media, and the stage drops what it keeps of a request
(``sgl_omni_stage_request_media_bytes``) when the request ends, is aborted or the stage
restarts."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sglang_omni.engines.synth_media import encode_png, frame_pixels
from sglang_omni.errors import StageDied
from sglang_omni.media.settings import policy_from_spec
from sglang_omni.pipeline.reasoner_media import ReasonerMedia
from sglang_omni.runtime.ipc import Channel, channel_pair
from sglang_omni.runtime.request_media import RequestMediaStore
from tests.media.media_http_server import PNG, MediaServer, serving
from tests.media.padded import padded_mp4, padded_png
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server
from tests.supervision.kit import fast, signal_stage, wait_health
from tests.umm.kit import (
    HTTP,
    SMALL,
    final,
    image,
    media_bytes,
    png_data_url,
    post_chat,
    post_generate,
    script,
    sha256,
    wait_for,
)

#: What one turn's message header may take beside its media (the guide, the script, the
#: decisions and receipts so far): far less than the client's picture.
HEADER_ALLOWANCE = 16 * 1024


def _noise_png(side: int) -> bytes:
    """A PNG that does not compress (about 3 bytes a pixel)."""
    pixels = np.random.default_rng(7).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


CLIENT_PNG = _noise_png(160)


@pytest.fixture(scope="module")
def media_host() -> Iterator[MediaServer]:
    with serving() as host:
        yield host


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def server(media_host: MediaServer, media_root: Path) -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", "0.02",
                "--allowed-media-domain", "127.0.0.1",
                "--allowed-local-media-path", str(media_root),
                *fast("reasoner", "generation")) as srv:
        yield srv


def chat_body(media_host: MediaServer, entries: list[dict], path: str) -> dict:
    url = f"http://127.0.0.1:{media_host.port}{path}"
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": script(*entries)},
        {"type": "image_url", "image_url": {"url": png_data_url(CLIENT_PNG)}},
        {"type": "image_url", "image_url": {"url": url}}]}],
        "stage_params": {"generation": SMALL}}


def sent_to_reasoner(server: Server) -> float:
    return Scrape(server).value("sgl_omni_stage_sent_bytes_total", stage="reasoner")


def held_by_reasoner(server: Server) -> float:
    return Scrape(server).value("sgl_omni_stage_request_media_bytes", stage="reasoner")


def settled(server: Server) -> None:
    """Wait until the Reasoner stage holds no request's media (the last test's requests ended):
    what it holds next is the test's own."""
    wait_for(lambda: held_by_reasoner(server) == 0, timeout=20)


def expected_image(prompt: str) -> bytes:
    """The scripted generator's PNG for ``prompt`` at SMALL's size and the default seed."""
    return encode_png(frame_pixels(prompt, 0, SMALL["width"], SMALL["height"], 0))


def test_every_turn_reads_every_item_once_sent(server: Server, media_host: MediaServer) -> None:
    turns = 4
    entries = [image("{media}") for _ in range(turns - 1)] + [final("{media}")]
    before = sent_to_reasoner(server)
    fetched = media_host.state.paths().count("/ok.png?once")
    resp = post_chat(server, chat_body(media_host, entries, "/ok.png?once"))
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    made = [media_bytes(segment) for segment in message["segments"][:-1]]
    assert len(made) == turns - 1
    # turn k read the client's two pictures, then the k images generated before it, in order
    seen = [{"kind": "image", "sha256": sha256(CLIENT_PNG)},
            {"kind": "image", "sha256": sha256(PNG)}]
    for k, data in enumerate(made):
        assert data == expected_image(json.dumps(seen)), f"turn {k} read other media"
        seen.append({"kind": "image", "sha256": sha256(data)})
    assert json.loads(message["content"]) == seen  # the last turn read all five
    # the remote picture was fetched once, not once a turn
    assert media_host.state.paths().count("/ok.png?once") - fetched == 1
    # each item crossed to the Reasoner stage once: the bytes sent are the media plus headers
    media = len(CLIENT_PNG) + len(PNG) + sum(len(data) for data in made)
    sent = sent_to_reasoner(server) - before
    assert media <= sent <= media + turns * HEADER_ALLOWANCE, (sent, media)


def test_bytes_sent_grow_with_media_not_with_turns(server: Server,
                                                   media_host: MediaServer) -> None:
    """Five more turns that add no media add headers only (the client's picture, sent inline
    before, went again on every turn)."""
    short = [final("done")]
    long = [image("") for _ in range(5)] + [final("done")]  # blank prompts: receipts
    costs = []
    for entries in (short, long):
        before = sent_to_reasoner(server)
        resp = post_chat(server, chat_body(media_host, entries, "/ok.png?grow"))
        assert resp.status_code == 200, resp.text
        costs.append(sent_to_reasoner(server) - before)
    assert costs[0] >= len(CLIENT_PNG) + len(PNG)
    assert costs[1] - costs[0] <= 5 * HEADER_ALLOWANCE, costs


def test_every_turn_reads_the_bytes_the_first_turn_read(server: Server,
                                                        media_root: Path) -> None:
    """A local file rewritten mid-request: the later turn still reads what the first read."""
    settled(server)
    picture = media_root / "changing.png"
    picture.write_bytes(PNG)
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": script(image("!sleep=2 slow"), final("{media}"))},
        {"type": "image_url", "image_url": {"url": str(picture)}}]}],
        "stage_params": {"generation": SMALL}}
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        wait_for(lambda: held_by_reasoner(server) >= len(PNG), timeout=20)  # turn 1 read it
        picture.write_bytes(CLIENT_PNG)
        raw = resp.read().decode()
    answer = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                     for line in raw.splitlines()
                     if line.startswith("data: {"))
    assert json.loads(answer)[0] == {"kind": "image", "sha256": sha256(PNG)}


def test_stage_drops_the_media_when_the_request_ends(server: Server,
                                                     media_host: MediaServer) -> None:
    settled(server)
    body = chat_body(media_host, [image("!sleep=2 slow"), final("done")], "/ok.png")
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        # its first turn ran; while the generation runs the stage holds the client's pictures
        wait_for(lambda: held_by_reasoner(server) >= len(CLIENT_PNG) + len(PNG), timeout=20)
        assert "[DONE]" in resp.read().decode()
    wait_for(lambda: held_by_reasoner(server) == 0, timeout=20)


def test_stage_drops_the_media_of_an_aborted_turn(server: Server,
                                                  media_host: MediaServer) -> None:
    settled(server)
    aborted = Scrape(server).value("sgl_omni_stage_jobs_total", stage="reasoner",
                                   outcome="aborted")
    body = chat_body(media_host, [image("quick"), final("late", delay_s=30)], "/ok.png")
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():  # the image's segment: its next turn runs now
            if '"segment"' in line:
                # that turn sent the image: the stage holds it beside the client's pictures
                wait_for(lambda: held_by_reasoner(server) > len(CLIENT_PNG) + len(PNG),
                         timeout=20)
                break  # the client leaves mid-turn
    # the turn is aborted and the stage drops the request's media
    wait_for(lambda: Scrape(server).value("sgl_omni_stage_jobs_total", stage="reasoner",
                                          outcome="aborted") == aborted + 1, timeout=20)
    wait_for(lambda: held_by_reasoner(server) == 0, timeout=20)


def test_a_reasoner_restart_mid_request_fails_it_and_the_retry_reads_everything(
        server: Server, media_host: MediaServer) -> None:
    settled(server)
    body = chat_body(media_host, [image("!sleep=3 slow"), final("{media}")], "/ok.png")
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions",
                     json={**body, "stream": True}) as resp:
        wait_for(lambda: held_by_reasoner(server) >= len(CLIENT_PNG) + len(PNG), timeout=20)
        signal_stage(server, "reasoner", signal.SIGKILL)  # it loses what it held
        raw = resp.read().decode()
    assert "reasoner stage process exited" in raw and "retry" in raw, raw
    wait_health(server, "ok")
    assert held_by_reasoner(server) == 0
    retry = post_chat(server, body)  # the same request again, from the start
    assert retry.status_code == 200, retry.text
    message = retry.json()["choices"][0]["message"]
    made = media_bytes(message["segments"][0])
    assert json.loads(message["content"]) == [
        {"kind": "image", "sha256": sha256(CLIENT_PNG)},
        {"kind": "image", "sha256": sha256(PNG)},
        {"kind": "image", "sha256": sha256(made)}]


@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions"])
def test_the_stage_reads_the_clients_exact_inline_bytes(server: Server, route: str) -> None:
    """Inline media go to the Reasoner stage as the client's base64 and are decoded there
    (issue 33, item 4): the stage reads exactly the client's bytes, images and videos, of
    every padding, within one window of the wire and over several, the same medium twice."""
    images = [padded_png(2 * 1024 * 1024 + 1, seed=1), padded_png(1000, seed=2)]
    videos = [padded_mp4(1_500_002, seed=3)]
    image_urls = [f"data:image/png;base64,{base64.b64encode(d).decode()}" for d in images]
    video_urls = [f"data:video/mp4;base64,{base64.b64encode(d).decode()}" for d in videos]
    image_urls.append(image_urls[0])
    prompt = script(final("{media}"))
    if route == "/generate":
        resp = post_generate(server, {"prompt": prompt, "images": image_urls,
                                      "videos": video_urls})
        assert resp.status_code == 200, resp.text
        read = json.loads(resp.json()["text"])
    else:
        resp = post_chat(server, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": prompt},
            *({"type": "image_url", "image_url": {"url": url}} for url in image_urls),
            *({"type": "video_url", "video_url": {"url": url}} for url in video_urls)]}]})
        assert resp.status_code == 200, resp.text
        read = json.loads(resp.json()["choices"][0]["message"]["content"])
    assert read == [*({"kind": "image", "sha256": sha256(d)} for d in [*images, images[0]]),
                    *({"kind": "video", "sha256": sha256(d)} for d in videos)]


# --- the two ends, without processes --------------------------------------------------------------
class _Handle:
    """What ReasonerMedia reads of a stage handle."""

    def __init__(self) -> None:
        self.name = "reasoner"
        self.process_generation = 1


def over_the_wire(media: dict, frames: list) -> list:
    """The frames the stage process receives of a submit carrying ``frames`` (sent as the
    server sends them: a client's inline medium as its base64 text)."""
    ours, theirs = channel_pair()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(Channel(theirs).recv()), daemon=True)
    reader.start()
    try:
        Channel(ours).send({"op": "submit", "media": media}, frames)
        reader.join(30)
    finally:
        ours.close()
        theirs.close()
    header, received = got[0]
    assert "wire_error" not in header and header["media"] == media
    return received


def _turn(*urls: str) -> dict:
    return {"messages": [{"role": "system", "content": "guide"}, {"role": "user", "content": [
        {"type": "text", "text": "look"},
        *({"type": "image_url", "image_url": {"url": url}} for url in urls)]}],
        "message_offset": 1}


def test_each_item_is_sent_once_and_a_lost_stage_fails_the_turn() -> None:
    media, handle, store = ReasonerMedia("r1", policy_from_spec({})), _Handle(), \
        RequestMediaStore("reasoner")
    inline = png_data_url(CLIENT_PNG)

    async def turn(frames: list[bytes], *urls: str) -> tuple[list[int], list]:
        call = await media.prepare(handle, _turn(inline, *urls), frames)  # type: ignore[arg-type]
        assert inline not in json.dumps(call.payload)  # no base64 inside the header
        received = over_the_wire(call.media, call.frames)
        job_frames = store.frames_for("r1", call.media, received)
        media.sent(handle, call)  # type: ignore[arg-type]
        return [len(f) for f in received], job_frames

    sent, seen = asyncio.run(turn([]))
    assert sent == [len(CLIENT_PNG)] and seen == [CLIENT_PNG]
    sent, seen = asyncio.run(turn([b"g0"], "omni-frame://0"))
    assert sent == [2] and seen == [CLIENT_PNG, b"g0"]  # only the new item crossed
    sent, seen = asyncio.run(turn([b"g0", b"g1"], "omni-frame://0", "omni-frame://1"))
    assert sent == [2] and seen == [CLIENT_PNG, b"g0", b"g1"]
    assert store.stats()["bytes"] == len(CLIENT_PNG) + 4
    handle.process_generation = 2  # the stage restarted: what it held is gone
    with pytest.raises(StageDied, match="restarted .* retry the request"):
        asyncio.run(turn([b"g0", b"g1"]))
    fresh = RequestMediaStore("reasoner")
    with pytest.raises(StageDied, match="no longer holds 1 media item"):
        fresh.frames_for("r1", {"keys": ["c0"], "new": []}, [])
    store.release("r1")
    assert store.stats()["bytes"] == 0 and store.stats()["requests"] == 0
    media.close()
