"""The playground page against real servers with the scripted engines, in chromium: the
interleaved page renders its image and video segments in order with the right sha256, Stop
aborts the generation on the server, a 400 shows its message, the API key is asked for and kept
in the tab; the text-only and direct generation pages work too. Each page's screenshot is taken
(docs/images/ with SGL_OMNI_SCREENSHOTS=1)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.kit import metric, script, wait_until
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.umm.kit import final, image, video

SIZE = {"width": 256, "height": 192, "num_frames": 9}
STORY = script(image("a red cube on a table"), video("the red cube rolls away"),
               final("Here is a red cube, then a video of it rolling away."),
               tail=" Draw a red cube, then make it roll.")


@pytest.fixture(scope="module")
def umm() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--model-name", "cosmos3",
                "--generation.factory.step_time_s", "0.1") as server:
        yield server


def open_page(page: Any, server: Server) -> None:
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready]")


def send(page: Any, prompt: str, **options: int) -> None:
    page.click("#options summary")
    fields = {"width": "#opt-width", "height": "#opt-height", "num_frames": "#opt-frames",
              "num_inference_steps": "#opt-steps"}
    for key, value in options.items():
        page.fill(fields[key], str(value))
    page.fill("#prompt", prompt)
    page.click("#options summary")
    page.click("#send")


def segments(page: Any) -> list[dict[str, Any]]:
    return page.eval_on_selector_all(".turn.assistant .segment", """nodes => nodes.map(n => ({
        kind: n.dataset.kind, index: n.dataset.index, sha256: n.dataset.sha256 || null,
        title: (n.querySelector("img, video") || {}).title || null,
        download: (n.querySelector("a.download") || {}).download || null}))""")


def shown_bytes_sha256(page: Any, index: int) -> str:
    """The sha256 of the bytes the page shows for segment ``index`` (its object URL)."""
    return page.evaluate("""async (i) => {
        const media = document.querySelectorAll(".turn.assistant .segment")[i]
            .querySelector("img, video");
        const bytes = new Uint8Array(await (await fetch(media.src)).arrayBuffer());
        return window.sha256HexPortable(bytes);
    }""", index)


def test_interleaved_segments_render_in_order_with_their_sha256(page: Any, umm: Server,
                                                                screenshot: Any) -> None:
    reference = httpx.post(f"{umm.url}/generate", timeout=60, json={
        "prompt": STORY, "stage_params": {"generation": SIZE}}).json()["segments"]
    open_page(page, umm)
    send(page, STORY, **SIZE)
    page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
    shown = segments(page)
    assert [(s["kind"], s["index"]) for s in shown] == [("image", "0"), ("video", "1"),
                                                         ("text", "2")]
    for i, kind in enumerate(("image", "video")):
        expected = reference[i]["data"]["sha256"]
        assert shown[i]["sha256"] == expected, kind  # the server's hash, as sent
        assert shown_bytes_sha256(page, i) == expected, kind  # and the bytes shown have it
        assert f"sha256 {expected}" in shown[i]["title"] and "bytes" in shown[i]["title"]
        assert shown[i]["download"] == f"segment-{i}.{'png' if kind == 'image' else 'mp4'}"
    assert page.inner_text(".turn.assistant .segment[data-kind=text]") == \
        "Here is a red cube, then a video of it rolling away."
    assert page.inner_text("#progress").startswith("done in")
    assert "3 Reasoner turns, 2 generations" in page.inner_text("#progress")
    page.wait_for_function("document.querySelector('#health-status').textContent === 'ok'")
    # the panel polls /v1/queue: its last poll may still show this request running
    page.wait_for_function(
        "document.querySelector('#queue').textContent.includes('0 of 32 running')")
    page.wait_for_function("[...document.querySelectorAll('video')].every(v => v.readyState >= 2)")
    screenshot(page, "playground-interleaved")


def test_progress_then_stop_aborts_the_generation(page: Any, umm: Server) -> None:
    before = metric(umm, "generation", "aborted", 0)
    open_page(page, umm)
    send(page, script(image("a slow cube"), final("never")), num_inference_steps=200,
         width=64, height=64)
    # a step past the first (the page may skip a step between two polls on a loaded machine)
    page.wait_for_function(
        "/image 1: step ([2-9]|[1-9][0-9]+) of 200/"
        ".test(document.querySelector('#progress').textContent)", timeout=30_000)
    line = page.inner_text("#progress")
    assert line.startswith("Reasoner turn 1 · image 1: step") and line.endswith(" s")
    page.click("#stop")
    page.wait_for_selector(".turn.assistant .notice")
    assert "Stopped after" in page.inner_text(".turn.assistant .notice")
    assert wait_until(lambda: metric(umm, "generation", "aborted", 0) == before + 1, timeout=10)
    assert "aborting its job on the generation stage" in umm.log()
    assert page.is_enabled("#send") and not page.is_enabled("#stop")


def test_a_400_shows_its_message(page: Any, umm: Server) -> None:
    open_page(page, umm)
    send(page, "draw something huge", width=100000, height=64)
    page.wait_for_selector("#chat-error:not([hidden])")
    message = page.inner_text("#chat-error")
    assert message.startswith("400: ") and "--server.max_pixels" in message
    assert page.query_selector(".turn.assistant") is None


def test_attachments_reach_the_reasoner_and_urls_follow_the_media_policy(page: Any,
                                                                         umm: Server) -> None:
    picture = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(picture, format="PNG")
    open_page(page, umm)
    page.set_input_files("#attach-file", files=[{"name": "red.png", "mimeType": "image/png",
                                                 "buffer": picture.getvalue()}])
    page.wait_for_selector("#attachments .chip")
    send(page, script(final("I see {media}")))
    page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
    seen = json.loads(page.inner_text(".turn.assistant .segment").removeprefix("I see "))
    assert seen == [{"kind": "image", "sha256": hashlib.sha256(picture.getvalue()).hexdigest()}]
    page.fill("#attach-url", "http://127.0.0.1:9/private.png")
    page.click("#attach-url-add")
    send(page, "what is this?")
    page.wait_for_selector("#chat-error:not([hidden])")
    assert "loopback" in page.inner_text("#chat-error")


def test_the_api_key_is_asked_for_and_kept_in_the_tab(page: Any) -> None:
    with Server(*SCRIPTED_UMM, "--api-key", "play-key") as keyed:
        page.goto(f"{keyed.url}/playground")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "wrong")
        page.click("#key-save")
        page.wait_for_selector("#key-dialog[open] #key-error:not([hidden])")
        assert "not valid" in page.inner_text("#key-error")
        page.fill("#key-input", "play-key")
        page.click("#key-save")
        page.wait_for_selector("body[data-ready]")
        assert page.evaluate("sessionStorage.getItem('sgl-omni-api-key')") == "play-key"
        assert page.evaluate("localStorage.length") == 0
        send(page, script(final("keyed hello")))
        page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
        assert page.inner_text(".turn.assistant .segment") == "keyed hello"


def test_text_only_chat_page(page: Any, screenshot: Any) -> None:
    with Server(*SCRIPTED_CHAT, "--model-name", "cosmos3-reasoner") as chat:
        open_page(page, chat)
        assert page.is_hidden("#generation-options") and page.is_hidden("#queue-box")
        page.fill("#prompt", "What is in a red cube?")
        page.click("#send")
        page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
        page.wait_for_function("!document.querySelector('#send').disabled")
        assert page.inner_text(".turn.assistant .segment") == \
            "scripted reasoner: you said 'What is in a red cube?'"
        page.fill("#prompt", "And a blue one?")
        page.click("#send")
        page.wait_for_function("document.querySelectorAll('.turn.assistant').length === 2")
        page.wait_for_function("!document.querySelector('#send').disabled")
        screenshot(page, "playground-text-only")


def test_direct_generation_forms(page: Any, screenshot: Any) -> None:
    with Server(*SCRIPTED_GENERATION, "--model-name", "cosmos3",
                "--generation.factory.step_time_s", "0.05") as direct:
        open_page(page, direct)
        page.fill("#image-size", "128x96")
        page.fill("#image-seed", "7")
        page.click("#image-go")
        page.wait_for_selector("#image-result .segment[data-sha256]", timeout=30_000)
        answer = httpx.post(f"{direct.url}/v1/images/generations", timeout=30, json={
            "prompt": page.input_value("#image-prompt"), "size": "128x96", "seed": 7}).json()
        expected = hashlib.sha256(base64.b64decode(answer["data"][0]["b64_json"])).hexdigest()
        assert page.get_attribute("#image-result .segment", "data-sha256") == expected
        page.click(".tab[data-tab=action]")
        page.click("#action-go")
        page.wait_for_function("document.querySelector('#action-result').textContent.length")
        assert '"object": "action.generation"' in page.inner_text("#action-result")
        page.click(".tab[data-tab=video]")
        page.fill("#video-steps", "8")
        page.click("#video-go")
        page.wait_for_selector("#video-result .segment[data-sha256]", timeout=30_000)
        status = page.inner_text("#video-status")
        assert "completed, 100%" in status
        page.wait_for_function("document.querySelector('#jobs').textContent.includes('100%')")
        page.wait_for_function(
            "[...document.querySelectorAll('video')].every(v => v.readyState >= 2)")
        screenshot(page, "playground-direct")
        page.fill("#video-steps", "200")
        page.click("#video-go")
        page.wait_for_function(
            "/in_progress, [1-9]/.test(document.querySelector('#video-status').textContent)",
            timeout=30_000)
        page.click("#video-stop")
        page.wait_for_function(
            "document.querySelector('#video-status').textContent.includes('stopped')")
        assert wait_until(lambda: metric(direct, "generation", "aborted", 0) == 1, timeout=10)


def in_view(page: Any, selector: str) -> bool:
    """Whether the last element matching ``selector`` is wholly visible: inside the
    conversation's scrolled box and inside the window."""
    return page.evaluate("""(selector) => {
        const nodes = document.querySelectorAll(selector);
        const r = nodes[nodes.length - 1].getBoundingClientRect();
        const c = document.querySelector("#conversation").getBoundingClientRect();
        return r.top >= c.top - 1 && r.bottom <= c.bottom + 1 && r.top >= 0
            && r.bottom <= window.innerHeight;
    }""", selector)


def test_examples_fill_the_prompt_on_the_empty_page(page: Any, umm: Server) -> None:
    open_page(page, umm)
    examples = page.locator("#examples button.example")
    assert page.is_visible("#examples") and examples.count() >= 2
    first = examples.first.get_attribute("title")  # the whole prompt, its script too
    examples.first.click()
    assert page.input_value("#prompt") == first
    send(page, script(final("hello")))
    page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
    assert page.is_hidden("#examples")  # a conversation has started
    page.click("#clear")
    assert page.is_visible("#examples")


def test_the_prompt_and_the_stop_note_stay_in_view(page: Any, umm: Server) -> None:
    open_page(page, umm)
    send(page, STORY, **SIZE)  # a tall answer: an image and a video
    page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
    page.wait_for_function("!document.querySelector('#send').disabled")
    send(page, script(image("a slow cube"), final("never")), num_inference_steps=200)
    page.wait_for_function("document.querySelectorAll('.turn.user').length === 2")
    assert in_view(page, ".turn.user")  # the question just sent, not below the fold
    page.wait_for_function(
        "/step [1-9]/.test(document.querySelector('#progress').textContent)", timeout=30_000)
    assert in_view(page, ".turn.user")
    page.click("#stop")
    page.wait_for_selector(".turn.assistant .notice")
    assert "Stopped after" in page.inner_text(".turn.assistant .notice")
    assert in_view(page, ".turn.assistant .notice")


def test_a_refused_request_is_not_done(page: Any, umm: Server) -> None:
    open_page(page, umm)
    send(page, "draw something huge", width=100000, height=64)
    page.wait_for_selector("#chat-error:not([hidden])")
    assert page.is_hidden("#progress") or "done" not in page.inner_text("#progress")


def test_the_queue_panel_explains_its_columns(page: Any, umm: Server) -> None:
    open_page(page, umm)
    send(page, script(image("a slow cube"), image("another"), final("done")),
         num_inference_steps=30, width=64, height=64)
    page.wait_for_selector("#queue table.plan td", timeout=30_000)
    headers = page.eval_on_selector_all("#queue th",
                                        "ths => ths.map(t => [t.textContent, t.title])")
    assert [h for h, _ in headers] == ["request", "phase", "generations", "latest finish"]
    assert "at most how many more" in headers[2][1] and "worst case" in headers[3][1]
    assert "worst case" in page.inner_text("#queue .legend")
    cells = page.eval_on_selector_all("#queue table.plan tr:nth-child(2) td",
                                      "tds => tds.map(t => t.textContent)")
    assert " made, ≤ " in cells[2] and " more" in cells[2]
    assert cells[3] == "not planned yet" or (cells[3].startswith("by ")
                                             and cells[3].endswith(" s from now"))
    page.click("#stop")
