"""The hf Reasoner reads a request's media a few at a time, within the request's media deadline.

``engines.hf.conversation.read_conversation`` (what ``HFReasoner.run`` reads a turn's media
with) against a loopback host whose answers wait at a gate the test opens: before, the parts
were fetched one after another, each with only its own per-fetch limits, so four slow parts
took four fetch deadlines. Nothing here measures time: the host says how many fetches wait at
once, and the deadline's failure names the setting.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from sglang_omni.contract.job import Job
from sglang_omni.engines.hf.conversation import Conversation, read_conversation
from sglang_omni.errors import MediaFetchFailed
from sglang_omni.media import MediaPolicy
from tests.media.media_http_server import PNG
from tests.media_http.gate_host import GateHost, gate_host


@pytest.fixture(scope="module")
def host() -> Iterator[GateHost]:
    with gate_host() as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(host: GateHost) -> Iterator[None]:
    host.reset()
    yield
    host.open.set()


def job_with(*urls: str) -> Job:
    content = [{"type": "text", "text": "what is in these?"}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return Job("r1", {"messages": [{"role": "user", "content": content}]}, [],
               emit=lambda _chunk: None)


def policy(request_deadline_s: float) -> MediaPolicy:
    """Loopback allowed; each fetch may take far longer than the request's deadline."""
    return MediaPolicy(allowed_media_domains=("127.0.0.1",), fetch_timeout_s=60,
                       fetch_deadline_s=60, request_deadline_s=request_deadline_s)


def test_parts_are_read_concurrently_bounded_and_in_order(host: GateHost) -> None:
    urls = [host.url(f"/gate/h{i}") for i in range(6)]
    out: list[Conversation | BaseException] = []

    def read() -> None:
        try:
            out.append(asyncio.run(read_conversation(job_with(*urls), policy(600))))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    # one after another never has four at the gate at once
    assert host.wait(lambda h: h.waiting >= 4), host.paths
    host.open.set()
    thread.join(120)
    assert out and isinstance(out[0], Conversation), out
    conversation = out[0]
    assert host.most_waiting == 4  # at most four at once
    assert [item.label for item in conversation.media] == [
        f"messages[0].content[{i + 1}].image_url" for i in range(6)]
    assert all(item.data == PNG for item in conversation.media)
    assert conversation.messages[0]["content"] == [{"type": "text", "text": "what is in these?"},
                                                   *[{"type": "image"}] * 6]


def test_a_request_over_its_media_deadline_fails_like_a_fetch_timeout(host: GateHost) -> None:
    job = job_with(host.url("/gate/slow1"), host.url("/gate/slow2"))
    with pytest.raises(MediaFetchFailed) as info:
        asyncio.run(read_conversation(job, policy(1)))
    message = info.value.message
    assert info.value.status == 500
    assert "--server.media_request_deadline_s" in message and "1 s" in message, message
    assert message.startswith("messages[0].content[1].image_url"), message
