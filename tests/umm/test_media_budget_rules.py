"""The client media budget's rules, without a server: what a request reserves before any fetch,
and that a reservation settles and is released once (``pipeline.admission.media_budget``)."""

from __future__ import annotations

import base64

import pytest

from sglang_omni.errors import ServiceUnavailable
from sglang_omni.media import MediaPolicy
from sglang_omni.pipeline.admission.media_budget import MediaBudget, worst_case_bytes

MiB = 2**20
POLICY = MediaPolicy(max_media_bytes=256 * MiB)  # the per-fetch limit: 64 MiB


def chat(*urls: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, *(
        {"type": "image_url", "image_url": {"url": url}} for url in urls)]}]


def test_remote_parts_count_at_the_fetch_limit_and_each_reference_once() -> None:
    messages = chat("https://example.com/a.png", "https://example.com/b.png",
                    "https://example.com/a.png")
    assert worst_case_bytes(messages, POLICY) == 2 * 64 * MiB


def test_inline_parts_count_at_their_size_and_the_total_at_max_media_bytes() -> None:
    inline = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + b"\0" * 996).decode()
    assert worst_case_bytes(chat(inline), POLICY) == 1000
    many = chat(*(f"https://example.com/{i}.png" for i in range(8)))
    assert worst_case_bytes(many, POLICY) == 256 * MiB
    assert worst_case_bytes([{"role": "user", "content": "no media"}], POLICY) == 0


def test_a_reservation_that_does_not_fit_is_refused_and_one_that_ends_frees_its_bytes() -> None:
    budget = MediaBudget(100)
    refused: list[bool] = []
    budget.on_refused = lambda: refused.append(True)
    first = budget.reserve(60)
    with pytest.raises(ServiceUnavailable, match="--server.max_client_media_bytes"):
        budget.reserve(50)
    assert refused == [True] and budget.held == 60
    assert budget.reserve(0).amount == 0  # no client media: never refused
    first.settle(10)
    second = budget.reserve(50)
    assert budget.held == 60
    first.release()
    first.release()  # once only
    first.settle(99)  # a released reservation counts nothing
    assert budget.held == 50
    second.release()
    assert budget.held == 0
