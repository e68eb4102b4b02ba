"""The playground says only what is so, in chromium against real servers (scripted engines):
it announces the scripted engines and its examples then carry a script that works; the queue
panel's allowance follows the server's ``max_dispatches``; the text-only page sends a
``max_tokens`` (a field with a default), wraps a long word in its bubble and says nothing of
images on a random-weight checkpoint; the direct page names the served model, shows a video
job's status from one store (the status line and the side panel agree) and drops the last
error and job line when a Send is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglang_omni.config import random_weights
from tests.kit import script
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.umm.kit import final, image


def open_page(page: Any, server: Server) -> None:
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready]")


def test_scripted_engines_are_announced_and_their_examples_run(page: Any) -> None:
    with Server(*SCRIPTED_UMM, "--model-name", "cosmos3") as umm:
        open_page(page, umm)
        assert page.is_visible("#scripted-notice")
        banner = page.inner_text("#scripted-notice")
        assert banner.startswith("Scripted engines (generation, reasoner), no model")
        assert page.is_hidden("#weights-notice")
        example = page.locator("#examples button.example").first
        assert "scripted turns" in example.inner_text()  # the script shows as a chip
        example.click()
        page.click("#send")
        page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
        kinds = page.eval_on_selector_all(".turn.assistant .segment",
                                          "nodes => nodes.map(n => n.dataset.kind)")
        assert kinds == ["image", "text"]
        answer = page.inner_text(".turn.assistant .segment[data-kind=text]")
        assert "no script entry" not in answer and answer.startswith("Here is a red cube")


def test_the_queue_panel_follows_max_dispatches(page: Any) -> None:
    """The demo's ``max_dispatches`` 3 allows one generation: once it runs, none more."""
    with Server(*SCRIPTED_UMM, "--orchestrator.factory.max_dispatches", "3",
                "--generation.factory.step_time_s", "0.1") as demo:
        open_page(page, demo)
        page.click("#options summary")
        page.fill("#opt-steps", "200")
        page.fill("#opt-width", "64")
        page.fill("#opt-height", "64")
        page.fill("#prompt", script(image("a slow cube"), final("done")))
        page.click("#send")
        page.wait_for_function(
            "/image 1: step [1-9]/.test(document.querySelector('#progress').textContent)",
            timeout=30_000)
        page.wait_for_function("[...document.querySelectorAll('#queue table.plan td')]"
                               ".some(td => td.textContent.startsWith('1 made'))",
                               timeout=30_000)
        cells = page.eval_on_selector_all("#queue table.plan tr:nth-child(2) td",
                                          "tds => tds.map(t => t.textContent)")
        assert cells[2] == "1 made, ≤ 0 more"
        page.click("#stop")


@pytest.fixture
def random_checkpoint(tmp_path: Path) -> Path:
    random_weights.record(tmp_path, "sgl-omni make-checkpoint --shape tiny --seed 3")
    return tmp_path


def test_text_only_page_bounds_its_answer_and_wraps_it(page: Any,
                                                       random_checkpoint: Path) -> None:
    with Server(*SCRIPTED_CHAT, "--model-path", str(random_checkpoint),
                "--model-name", "cosmos3-reasoner") as chat:
        open_page(page, chat)
        notice = page.inner_text("#weights-notice")
        assert notice.startswith("Random weights: answers are gibberish")
        assert "image" not in notice
        page.click("#options summary")
        assert page.is_visible("#opt-max-tokens") and page.input_value("#opt-max-tokens") == "256"
        page.click("#options summary")
        word = "gibberish" * 200  # one long word, as a random model writes
        page.fill("#prompt", script(final(word), tail=""))
        with page.expect_request("**/v1/chat/completions") as sent:
            page.click("#send")
        assert json.loads(sent.value.post_data)["max_tokens"] == 256
        page.wait_for_selector(".turn.assistant .segment[data-kind=text]", timeout=30_000)
        page.wait_for_function("!document.querySelector('#send').disabled")
        assert page.inner_text(".turn.assistant .segment") == word
        fits = page.evaluate("""() => {
            const bubble = document.querySelector(".turn.assistant");
            const box = document.querySelector("#conversation").getBoundingClientRect();
            const r = bubble.getBoundingClientRect();
            return bubble.scrollWidth <= bubble.clientWidth + 1 && r.right <= box.right + 1;
        }""")
        assert fits, "the answer overflows its bubble"
        page.click("#options summary")
        page.fill("#opt-max-tokens", "8")
        page.fill("#prompt", "again")
        with page.expect_request("**/v1/chat/completions") as sent:
            page.click("#send")
        assert json.loads(sent.value.post_data)["max_tokens"] == 8


def test_direct_page_status_from_one_store(page: Any) -> None:
    with Server(*SCRIPTED_GENERATION, "--model-name", "cosmos3",
                "--generation.factory.step_time_s", "0.05") as direct:
        open_page(page, direct)
        line = page.inner_text("#model-line")
        assert line.startswith("model cosmos3 · direct generation")
        assert line.endswith("pipeline Cosmos3PipelineConfig")
        page.click(".tab[data-tab=video]")
        page.fill("#video-steps", "8")
        page.click("#video-go")
        page.wait_for_selector("#video-result .segment[data-sha256]", timeout=30_000)
        status, listed = page.evaluate("""() => [
            document.querySelector("#video-status").textContent,
            [...document.querySelectorAll("#jobs li")].map(li => li.textContent)]""")
        assert status.startswith("job ") and ": completed, 100% · " in status
        job = status.split()[1].rstrip(":")
        assert listed == [f"{job[:10]}: completed, 100%"]  # the same, at the same moment
        page.fill("#video-size", "99999x99999")  # in the field's pattern; the server refuses
        page.click("#video-go")
        page.wait_for_selector("#video-error:not([hidden])")
        assert page.inner_text("#video-error").startswith("400: ")
        assert page.is_hidden("#video-status")  # the last job's line is not this Send's
        page.fill("#video-size", "64x64")
        page.click("#video-go")
        page.wait_for_function("document.querySelectorAll('#video-result .segment').length === 2",
                               timeout=30_000)
        assert page.is_hidden("#video-error")  # no stale error beside the new job
        assert ": completed, 100%" in page.inner_text("#video-status")
