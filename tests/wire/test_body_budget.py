"""The server-wide body budget (``server.max_pending_body_bytes``): bodies being read and
parsed at once are bounded together; one that does not fit beside the others is refused with
503 before it is buffered, and a body whose client leaves gives its share back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_omni.errors import ServiceUnavailable
from sglang_omni.serve.bodies.body_budget import BodyBudget
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server
from tests.wire.kit import error_of, post_raw, refused_beside_upload, refused_prompt, status_within

BUDGET = 1_000_000
FLAGS = ["--server.max_body_bytes", "1048576", "--server.max_pending_body_bytes", str(BUDGET),
         "--server.body_timeout_s", "10"]


def test_a_lease_holds_what_its_body_covers_and_gives_it_back() -> None:
    budget = BodyBudget(100)
    with budget.lease() as first:
        first.cover(60)
        first.cover(40)  # less than held: nothing more taken
        assert budget.held == 60
        with budget.lease() as second:
            second.cover(30)
            second.cover(40)  # a chunked body growing
            assert budget.held == 100
            with pytest.raises(ServiceUnavailable) as refused:
                budget.lease().cover(1)
            assert "server.max_pending_body_bytes" in refused.value.message
            assert budget.held == 100  # a refused body takes nothing
        assert budget.held == 60
    assert budget.held == 0
    with budget.lease() as alone:  # a body alone always fits, whatever its size
        alone.cover(500)
        alone.close()
        alone.close()
    assert budget.held == 0


def test_a_resized_lease_gives_back_at_once_and_grows_as_cover_does() -> None:
    budget = BodyBudget(100)
    with budget.lease() as first, budget.lease() as second:
        first.resize(70)
        second.resize(30)
        with pytest.raises(ServiceUnavailable):
            second.resize(31)  # does not fit beside the first
        assert (budget.held, second.held) == (100, 30)
        first.resize(10)  # a message taken by the app: its bytes go back
        assert budget.held == 40
        second.resize(90)
        assert budget.held == 100
    assert budget.held == 0


@pytest.fixture(scope="module")
def budgeted() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *FLAGS) as server:
        yield server


def test_a_body_that_does_not_fit_beside_others_waits_for_them(budgeted: Server) -> None:
    url = budgeted.url
    held, resp = refused_beside_upload(url, 800_000, refused_prompt(500_000))
    try:
        assert resp.status_code == 503
        error = error_of(resp)
        assert "server.max_pending_body_bytes" in error["message"]
        assert "800000 bytes of other request bodies" in error["message"]
        assert int(resp.headers["retry-after"]) > 0
        small = post_raw(f"{url}/generate", refused_prompt(1_000))  # fits beside the held one
        assert small.status_code == 400, small.text
        held_now = Scrape(budgeted)
        assert held_now.value("sgl_omni_pending_body_bytes") == 800_000
        assert held_now.value("sgl_omni_admission_refusals_total", reason="body_budget") >= 1
    finally:
        held.close()  # its client leaves mid-body
    # Its share is given back: the body that was refused fits now, and so does one alone that
    # is larger than the budget (max_body_bytes allows it).
    assert status_within(url, refused_prompt(500_000), 400).status_code == 400
    assert post_raw(f"{url}/generate", refused_prompt(1_040_000)).status_code == 400
    assert Scrape(budgeted).value("sgl_omni_pending_body_bytes") == 0
