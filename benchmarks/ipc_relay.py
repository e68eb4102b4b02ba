"""Relay 8 MiB media frames through the stage IPC channel and print the throughput.

Usage: python benchmarks/ipc_relay.py [--mib 8] [--rounds 50]

A spawned process (as stage processes are) echoes every frame back over ``ipc.Channel``; the
figure is bytes moved one way per second (each round moves the payload there and back).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

from sglang_omni.runtime.ipc import Channel, channel_pair


def echo(sock) -> None:  # noqa: ANN001 - a socket
    channel = Channel(sock)
    while True:
        header, frames = channel.recv()
        if header.get("op") == "stop":
            return
        channel.send(header, frames)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    ours, theirs = channel_pair()
    proc = ctx.Process(target=echo, args=(theirs,))
    proc.start()
    theirs.close()
    channel = Channel(ours)
    payload = os.urandom(args.mib * 1024 * 1024)
    header = {"op": "result", "rid": "bench", "token": 1,
              "payload": {"media": [{"kind": "video", "mime_type": "video/mp4", "frame": 0}]}}
    for _ in range(3):  # warm up
        channel.send(header, [payload])
        channel.recv()
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        channel.send(header, [payload])
        _, frames = channel.recv()
        times.append(time.perf_counter() - start)
        assert len(frames[0]) == len(payload)
    channel.send({"op": "stop"})
    proc.join()
    times.sort()
    one_way = [t / 2 for t in times]
    size = len(payload)
    print(f"payload {args.mib} MiB, {args.rounds} round trips through a spawned process")
    print(f"one-way relay: median {size / one_way[len(one_way) // 2] / 1e9:.2f} GB/s, "
          f"worst {size / one_way[-1] / 1e9:.2f} GB/s, "
          f"median latency {one_way[len(one_way) // 2] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
