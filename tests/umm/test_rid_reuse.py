"""Client request ids over HTTP (issue 11, defect 8): a request refused before any work (503 at
max_active, 400 for a bad request) does not use up its ``rid``, so the client can retry with it;
an id in flight or recently finished is refused with 400."""

from __future__ import annotations

import pytest

from tests.kit import error_message as error_of  # the message of the JSON error answer
from tests.server import SCRIPTED_CHAT, Server
from tests.umm.kit import HTTP, final, image, post_chat, post_generate, script, umm_server

SMALL = {"width": 32, "height": 32}
# 10 steps of 0.1 s: the request holds the only admission slot for about a second.
SLOW = {"prompt": script(image("slow"), final("slow done")),
        "stage_params": {"generation": {**SMALL, "num_inference_steps": 10}}}
QUICK = {"prompt": script(final("quick")), "stage_params": {"generation": SMALL}}


@pytest.fixture(scope="module")
def server():
    with umm_server("--generation.factory.step_time_s", "0.1",
                    "--orchestrator.factory.max_active", "1") as srv:
        yield srv


def test_a_503_retried_with_the_same_rid_is_accepted(server: Server) -> None:
    with HTTP.stream("POST", f"{server.url}/generate",
                     json={**SLOW, "rid": "holder-1", "stream": True}) as holder:
        assert holder.status_code == 200  # admitted: it holds the only slot
        busy = post_generate(server, {**QUICK, "rid": "retry-1"})
        assert busy.status_code == 503, busy.text
        assert "max_active" in error_of(busy)
        busy_chat = post_chat(server, {"messages": [{"role": "user", "content": "hi"}],
                                       "rid": "retry-2"})
        assert busy_chat.status_code == 503, busy_chat.text
        in_flight = post_generate(server, {**QUICK, "rid": "holder-1"})
        assert in_flight.status_code == 400, in_flight.text
        assert "holder-1" in error_of(in_flight)
        holder.read()
    retried = post_generate(server, {**QUICK, "rid": "retry-1"})
    assert retried.status_code == 200, retried.text
    assert retried.json()["execution_id"] == "retry-1"
    retried_chat = post_chat(server, {"messages": [{"role": "user", "content": QUICK["prompt"]}],
                                      "rid": "retry-2"})
    assert retried_chat.status_code == 200, retried_chat.text


def test_a_finished_rid_stays_taken(server: Server) -> None:
    assert post_generate(server, {**QUICK, "rid": "done-1"}).status_code == 200
    again = post_generate(server, {**QUICK, "rid": "done-1"})
    assert again.status_code == 400
    assert "done-1" in error_of(again)


def test_a_400_refusal_does_not_burn_the_rid(server: Server) -> None:
    for rid, generation in (("fix-1", {"width": 99_999, "height": 32}),  # a limit
                            ("fix-2", {**SMALL, "guidance_scale": "high"})):  # the adapter
        bad = post_generate(server, {**QUICK, "rid": rid,
                                     "stage_params": {"generation": generation}})
        assert bad.status_code == 400, bad.text
        fixed = post_generate(server, {**QUICK, "rid": rid})
        assert fixed.status_code == 200, fixed.text


def test_text_only_chat_ends_and_frees_rids_like_the_interleaved_routes() -> None:
    refusal = script({"error": {"status": 400, "message": "bad native field"}})
    with Server(*SCRIPTED_CHAT) as chat_server:
        def chat(rid: str, content: str, stream: bool = False):
            return HTTP.post(f"{chat_server.url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": content}], "rid": rid,
                "stream": stream})

        for stream in (False, True):
            rid = f"chat-{stream}"
            assert chat(rid, refusal, stream).status_code == 400  # refused by the stage
            assert chat(rid, "hello", stream).status_code == 200  # same rid: accepted
            again = chat(rid, "hello", stream)  # ended (the stream too): still taken
            assert again.status_code == 400 and rid in error_of(again)


def test_the_next_request_sent_as_an_answer_arrives_is_admitted(server: Server) -> None:
    """At max_active 1, a client that sends its next request the moment it has its answer (a
    stream read to ``[DONE]``, or a JSON body) is admitted: the answered request stopped
    counting before its last byte left the server, though its release comes after (it closes
    the stream's iterators, which may wait for the loop)."""
    refused = []
    one_image = {"prompt": script(image("one"), final("done")),
                 "stage_params": {"generation": {**SMALL, "num_inference_steps": 1}}}
    for i in range(20):
        with HTTP.stream("POST", f"{server.url}/generate",
                         json={**one_image, "rid": f"seq-stream-{i}", "stream": True}) as streamed:
            assert streamed.status_code == 200
            streamed.read()
        for route, answer in (("generate", post_generate(server, one_image)),
                              ("chat", post_chat(server, {"messages": [
                                  {"role": "user", "content": QUICK["prompt"]}]}))):
            if answer.status_code != 200:
                refused.append((i, route, answer.status_code, answer.text[:120]))
    assert refused == []
