"""At most eight generations per request; the Reasoner hears a receipt for a ninth."""

from __future__ import annotations

import pytest

from tests.server import Server
from tests.umm.kit import (
    SMALL,
    counts,
    final,
    image,
    only,
    post_generate,
    script,
    segments_of,
    stream_generate,
    umm_server,
)

NINE_IMAGES = script(*(image(f"picture {i}") for i in range(9)), final("{last}"))
RECEIPT = "Receipt: no more generations fit in this request, so the image was not generated."


@pytest.fixture(scope="module")
def roomy():
    """Dispatches to spare, so that the eight-generation limit is the one that binds."""
    with umm_server("--generation.factory.step_time_s", "0", "--orchestrator.factory."
                    "max_dispatches", "18", "--orchestrator.factory.max_outputs", "18") as srv:
        yield srv


def test_eight_images_then_a_receipt_for_the_ninth(roomy) -> None:
    before = counts(roomy)
    resp = post_generate(roomy, {"prompt": NINE_IMAGES, "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["image"] * 8 + ["text"]
    assert body["text"].startswith(RECEIPT)
    assert body["usage"]["generations"] == 8 and body["usage"]["reasoner_turns"] == 10
    after = counts(roomy)
    assert after["generation", "submitted"] - before["generation", "submitted"] == 8


def test_eight_generations_fill_the_default_dispatch_limit(server: Server) -> None:
    resp = post_generate(server, {"prompt": script(*(image(f"p{i}") for i in range(8)),
                                                    final("{last}")),
                                   "stage_params": {"generation": SMALL}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [s["kind"] for s in body["segments"]] == ["image"] * 8 + ["text"]
    # the ninth turn is told that no generation is left, at the end of its prompt
    assert body["text"] == ("Generated image 8, from the prompt: p7\n\n"
                            "No generations are left: give the final answer now.")


def test_ninth_image_at_default_limits_fails_naming_max_dispatches(server: Server) -> None:
    """The ninth decision is the 17th dispatch: its turn was offered only a final answer, and no
    dispatch is left for a receipt, so a Reasoner ignoring its format fails the request."""
    status, events = stream_generate(server, {"prompt": NINE_IMAGES,
                                               "stage_params": {"generation": SMALL}})
    assert status == 200
    assert [s["kind"] for s in segments_of(events)] == ["image"] * 8
    error = only(events, "error")
    assert error["code"] == 500 and "max_dispatches" in error["message"]
