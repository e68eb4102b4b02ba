"""What the stage wire's codec (``contract.messages``) costs per message, in this process.

Usage: python benchmarks/stage_messages.py [--json PATH]

For a typical ``submit`` (a chat payload), ``result``, ``chunk`` and ``pong``: microseconds to
encode the typed message to its map, to pack it (``ipc.pack_message``, msgpack), to put it back
together from its header piece (``ipc.Incoming``) and to decode the map (checking every field);
median of 7 rounds of 20,000. Only the encode and decode columns are new with typed messages;
packing and framing were paid before too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_omni.contract import messages as m
from sglang_omni.runtime.ipc import Incoming, pack_message

ROUNDS, CALLS = 7, 20_000

MESSAGES: dict[str, m.Message] = {
    "submit": m.Submit("r-0123456789", 3, {
        "messages": [{"role": "user", "content": "draw a cat on a mat"}],
        "turn_index": 0, "sampling": {"temperature": 0.7, "seed": 5}}, 123.4,
        {"keys": ["c0"], "new": ["c0"]}),
    "result": m.Result("r-0123456789", 3, {"text": "a cat", "finish_reason": "stop"}, 0.012,
                       {"prepare": 0.001, "decode": 0.01}),
    "chunk": m.Chunk("r-0123456789", 3, {"delta": "a c"}),
    "pong": m.Pong(12, {"decoded": 4, "bytes": 1024}, {"bytes": 0, "requests": 0}, None,
                   {"steps": 10}),
}


def per_call_us(fn: Callable[[], Any]) -> float:
    rounds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - started) / CALLS * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    print("| message | encode us | pack us | frame us | decode us |")
    print("|---|---|---|---|---|")
    for name, message in MESSAGES.items():
        header = m.encode(message)
        head = pack_message(header).head
        row = {"encode_us": per_call_us(lambda: m.encode(message)),  # noqa: B023
               "pack_us": per_call_us(lambda: pack_message(header)),  # noqa: B023
               "frame_us": per_call_us(lambda: Incoming(head)),  # noqa: B023
               "decode_us": per_call_us(lambda: m.decode(header))}  # noqa: B023
        figures[name] = row
        print(f"| {name} | " + " | ".join(f"{value:.2f}" for value in row.values()) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
