"""Omni's multipart parser (``serve/bodies/multipart_body.py``) against Starlette's
(``request.form()``:
``starlette.formparsers.MultiPartParser`` over python-multipart), on the same bodies.

Usage: python benchmarks/multipart_parsers.py  (python-multipart must be importable: it is not
one of Omni's dependencies; ``pip install --target /tmp/pm python-multipart`` and
``PYTHONPATH=/tmp/pm`` is enough)

For each body (one upload of 8 or 64 MiB beside 20 text fields; 500 small text fields) it
reports the CPU seconds and the peak of Python-allocated memory (tracemalloc) from the body's
chunks as uvicorn hands them over (64 KiB each) to the fields and the upload's bytes in hand
(the routes turn an upload into a ``data:`` URL, so Starlette's spooled file is read back).
Omni reads the whole body first (``read_body``: one bytes object, the size limit, the deadline
and the body budget), then splits it. Then the limits: what each does with a part head of
1 MiB, 600 fields, and a text field of 2 MiB.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from sglang_omni.errors import OmniError
from sglang_omni.serve.bodies.multipart_body import MAX_FORM_PARTS, parse_form

MiB = 1024 * 1024
BOUNDARY = b"----omni-bench-boundary-7d1c"
CHUNK = 64 * 1024


def part(name: str, data: bytes, filename: str | None = None, head_pad: int = 0) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"Content-Disposition: {disposition}\r\n".encode()
    if filename:
        head += b"Content-Type: video/mp4\r\n"
    if head_pad:
        head += b"X-Pad: " + b"a" * head_pad + b"\r\n"
    return b"--" + BOUNDARY + b"\r\n" + head + b"\r\n" + data + b"\r\n"


def body(parts: list[bytes]) -> bytes:
    return b"".join(parts) + b"--" + BOUNDARY + b"--\r\n"


def upload_body(size: int) -> bytes:
    fields = [part(f"field{i}", f"value {i}".encode()) for i in range(20)]
    return body([*fields, part("input_reference", b"\x01" * size, "clip.mp4")])


def chunks(raw: bytes) -> list[bytes]:
    return [raw[i:i + CHUNK] for i in range(0, len(raw), CHUNK)]


async def omni(pieces: list[bytes]) -> Any:
    raw = b"".join(pieces)  # read_body's result
    return parse_form(raw, BOUNDARY)


async def starlette(pieces: list[bytes], **limits: Any) -> Any:
    async def stream() -> AsyncGenerator[bytes, None]:
        for piece in pieces:
            yield piece
        yield b""

    headers = Headers({"content-type": f"multipart/form-data; boundary={BOUNDARY.decode()}"})
    form = await MultiPartParser(headers, stream(), **limits).parse()
    out = []
    for name, value in form.multi_items():
        out.append((name, await value.read() if isinstance(value, UploadFile) else value))
    await form.close()
    return out


def measure(parse: Callable[[list[bytes]], Coroutine[Any, Any, Any]], raw: bytes
            ) -> tuple[float, float, float]:
    """(CPU ms, wall ms: medians of 5; peak MiB allocated beyond the chunks)."""
    pieces = chunks(raw)
    cpu, wall = [], []
    for _ in range(5):
        gc.collect()
        start, start_wall = time.process_time(), time.perf_counter()
        asyncio.run(parse(pieces))
        cpu.append(time.process_time() - start)
        wall.append(time.perf_counter() - start_wall)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = asyncio.run(parse(pieces))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return sorted(cpu)[2] * 1e3, sorted(wall)[2] * 1e3, peak / MiB


def outcome(parse: Callable[[], Coroutine[Any, Any, Any]]) -> str:
    try:
        result = asyncio.run(parse())
    except OmniError as exc:
        return f"{exc.status} {exc.message[:70]}"
    except MultiPartException as exc:
        return f"400 (HTTPException, detail) {exc.message[:60]}"
    items = len(result.fields) + len(result.files) if hasattr(result, "fields") else len(result)
    return f"accepted ({items} items)"


def main() -> None:
    bodies = {"1 x 8 MiB upload + 20 fields": upload_body(8 * MiB),
              "1 x 64 MiB upload + 20 fields": upload_body(64 * MiB),
              "500 text fields": body([part(f"f{i}", b"x" * 40) for i in range(500)])}
    print(f"{'body':32} {'parser':10} {'CPU ms':>8} {'wall ms':>8} {'peak MiB':>9}")
    for label, raw in bodies.items():
        for name, parse in (("omni", omni), ("starlette", starlette)):
            cpu_ms, wall_ms, peak = measure(parse, raw)
            print(f"{label:32} {name:10} {cpu_ms:8.1f} {wall_ms:8.1f} {peak:9.1f}")
    limits = {"max_files": 16, "max_fields": MAX_FORM_PARTS, "max_part_size": 1 * MiB}
    cases = {"part head of 1 MiB": body([part("a", b"1", head_pad=MiB)]),
             "600 text fields": body([part(f"f{i}", b"1") for i in range(600)]),
             "one text field of 2 MiB": body([part("prompt", b"p" * 2 * MiB)])}
    print(f"\nlimits (starlette with {limits}):")
    for label, raw in cases.items():
        print(f"  {label}:")
        print(f"    omni:      {outcome(lambda r=raw: omni(chunks(r)))}")
        print(f"    starlette: {outcome(lambda r=raw: starlette(chunks(r), **limits))}")


if __name__ == "__main__":
    main()
