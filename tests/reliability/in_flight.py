"""Requests left running in threads while a test breaks or stops the server, and the error each
answer ended with (shared by the fault and shutdown tests)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.kit import parse_sse, script
from tests.reliability.kit import SMALL, error_shape_problem

#: Prompts that hold a request in a Reasoner turn, or in a generation, for a minute.
IN_REASONER = script({"action": "final", "text": "never", "delay_s": 60})
IN_GENERATION = script({"action": "image", "prompt": "!sleep=60 held"},
                       {"action": "final", "text": "never"})
GEN = {"generation": SMALL}


@dataclass
class InFlight:
    """One request running in a thread; ``ended`` is the monotonic time its answer ended.
    ``slow_body`` holds the body back until the event given to :meth:`start` is set."""

    label: str
    route: str
    body: dict[str, Any]
    slow_body: bool = False
    status: int | None = None
    headers: httpx.Headers | None = None
    text: str = ""
    ended: float | None = None

    def start(self, url: str, release: threading.Event | None = None) -> threading.Thread:
        def content() -> Iterator[bytes]:
            raw = httpx.Request("POST", "/", json=self.body).content
            yield raw[:10]
            if release is not None:
                release.wait(30)
            yield raw[10:]

        def run() -> None:
            try:
                with httpx.Client(timeout=60) as http:
                    if self.slow_body:
                        resp = http.post(url + self.route, content=content(),
                                         headers={"Content-Type": "application/json"})
                    else:
                        resp = http.post(url + self.route, json=self.body)
                self.status, self.headers, self.text = resp.status_code, resp.headers, resp.text
            except httpx.HTTPError as exc:
                self.text = f"transport error {exc!r}"
            self.ended = time.monotonic()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def error(self, statuses: tuple[int, ...]) -> tuple[dict[str, Any] | None, str | None]:
        """``(error object, None)`` when the answer ended with exactly one error in its route's
        form (a stream's error event or chunk before ``[DONE]``, or a JSON error body with one
        of ``statuses``); ``(None, what is wrong)`` otherwise."""
        if self.status == 200 and self.body.get("stream"):
            events = parse_sse(self.text)
            if not events or events[-1][1] != "[DONE]":
                return None, f"{self.label}: stream not ended by [DONE]: {self.text[-300:]!r}"
            errors = [d if e == "error" else d.get("error") for e, d in events[:-1]
                      if e == "error" or isinstance(d, dict) and "error" in d]
            if len(errors) != 1:
                return None, f"{self.label}: expected one error in the stream: " \
                    f"{self.text[-300:]!r}"
            return errors[0], None
        if self.status in statuses:
            body = json.loads(self.text)
            if error_shape_problem(body) is not None:
                return None, f"{self.label}: {error_shape_problem(body)}"
            return body["error"], None
        return None, f"{self.label}: status {self.status}: {self.text[:300]}"


def interleaved(prompt: str, where: str) -> list[InFlight]:
    """``/generate`` (plain and streamed) and a streamed chat, held by ``prompt``."""
    return [InFlight(f"/generate {where}", "/generate", {"prompt": prompt, "stage_params": GEN}),
            InFlight(f"/generate stream {where}", "/generate",
                     {"prompt": prompt, "stage_params": GEN, "stream": True}),
            InFlight(f"chat stream {where}", "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": prompt}], "stage_params": GEN,
                      "stream": True})]
