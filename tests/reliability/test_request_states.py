"""One state per request (``pipeline.request_state``): whatever ends a request (its answer, a
refusal, a client that vanishes mid-stream or before its answer, a client timeout), its state
is released, so ``sgl_omni_request_states`` comes back to 0; while a request runs it counts it.
The stage faults (``test_faults``) and the 1,000 aborts (``test_resources``) check the same."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.kit import no_request_states, request_states, wait_for
from tests.reliability.in_flight import IN_GENERATION, IN_REASONER
from tests.reliability.kit import SMALL, TrackedServer, script

GEN = {"generation": SMALL}
ONE_IMAGE = script({"action": "image", "prompt": "a"}, {"action": "final", "text": "ok"})
SLOW_TEXT = script({"action": "final", "text": "slow", "delay_s": 60})


def _vanish_mid_stream(url: str, route: str, body: dict[str, Any]) -> int:
    """Stream ``body`` and close the connection once the headers came; the status."""
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", url + route, json={**body, "stream": True}) as resp:
        return resp.status_code


def _time_out(url: str, route: str, body: dict[str, Any]) -> None:
    """Send ``body`` (not streamed) and give up after 0.5 s, the answer still to come."""
    with httpx.Client(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post(url + route, json=body)


def _held_then_counted(server: TrackedServer, route: str, body: dict[str, Any]) -> float:
    """Start ``body`` in a thread; the gauge once it counts it (the request is then ended by
    the client timing out)."""
    before = request_states(server.server)
    thread = threading.Thread(target=_time_out, args=(server.url, route, body), daemon=True)
    thread.start()
    wait_for(lambda: request_states(server.server) > before)
    counted = request_states(server.server)
    thread.join(10)
    return counted


@pytest.mark.timeout(90)
def test_interleaved_request_states_return_to_zero(umm: TrackedServer) -> None:
    url = umm.url
    assert no_request_states(umm.server) is None
    # counted while it runs
    assert _held_then_counted(umm, "/generate",
                              {"prompt": IN_GENERATION, "stage_params": GEN}) >= 1
    with httpx.Client(timeout=30) as http:
        ok = http.post(f"{url}/generate", json={"prompt": ONE_IMAGE, "stage_params": GEN})
        assert ok.status_code == 200, ok.text[:200]
        refused = http.post(f"{url}/generate", json={"prompt": ONE_IMAGE, "stage_params": {
            "generation": {"width": 10**6, "height": 32}}})
        assert refused.status_code == 400, refused.text[:200]
        bad_rid = http.post(f"{url}/generate", json={"prompt": ONE_IMAGE, "rid": ""})
        assert bad_rid.status_code == 400, bad_rid.text[:200]
    for prompt in (IN_REASONER, IN_GENERATION):  # a client gone in a turn, in a generation
        assert _vanish_mid_stream(url, "/generate",
                                  {"prompt": prompt, "stage_params": GEN}) == 200
        assert _vanish_mid_stream(url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}], "stage_params": GEN}) == 200
        _time_out(url, "/v1/chat/completions",
                  {"messages": [{"role": "user", "content": prompt}], "stage_params": GEN})
    assert no_request_states(umm.server) is None


@pytest.mark.timeout(90)
def test_text_chat_request_states_return_to_zero(chat: TrackedServer) -> None:
    url = chat.url
    slow = {"messages": [{"role": "user", "content": SLOW_TEXT}]}
    assert no_request_states(chat.server) is None
    assert _held_then_counted(chat, "/v1/chat/completions", slow) >= 1
    with httpx.Client(timeout=30) as http:
        for stream in (False, True):
            ok = http.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hello"}], "stream": stream})
            assert ok.status_code == 200, ok.text[:200]
        taken = {"messages": [{"role": "user", "content": "hello"}], "rid": "taken"}
        assert http.post(f"{url}/v1/chat/completions", json=taken).status_code == 200
        again = http.post(f"{url}/v1/chat/completions", json=taken)
        assert again.status_code == 400, again.text[:200]  # refused: its rid is in use
    assert _vanish_mid_stream(url, "/v1/chat/completions", slow) == 200
    _time_out(url, "/v1/chat/completions", slow)
    started = time.monotonic()
    assert no_request_states(chat.server) is None, f"after {time.monotonic() - started:.1f} s"
