"""Read a JSON request body: the one way every route reads one.

Contract of :func:`read_json_body`, checked in this order, before any work is done:

* the Content-Type is ``application/json`` or ``application/*+json`` (or absent) -> else 415;
* the body is at most ``server.max_body_bytes`` (Content-Length up front, then counted while it
  streams, so a chunked or lying body is cut off too) -> else 413;
* it fits beside the other bodies being read (``server.max_pending_body_bytes``, when the route
  reads it under a lease: :mod:`.body_budget`) -> else 503;
* the whole body arrives within ``server.body_timeout_s`` -> else 408;
* it holds at most ``server.max_json_values`` values (counted before it is parsed, from its
  commas and opening brackets: an upper bound, as those inside strings count too) -> else 400;
* it is UTF-8 JSON without NaN/Infinity and without integer literals over Python's digit
  limit, nested at most ``server.max_json_depth`` deep -> else 400;
* every value can cross the stage IPC (msgpack): integers in [-2**63, 2**64), finite floats,
  strings and keys without lone surrogates -> else 400 naming the field path.

The route's settings are read from ``request.app.state.server_settings`` (a ``ServerSettings``;
defaults when the app has none).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import (
    BadRequest,
    PayloadTooLarge,
    RequestTooSlow,
    UnsupportedMediaType,
)
from sglang_omni.serve.bodies.body_budget import BodyLease
from sglang_omni.serve.bodies.body_runs import RunSplitter

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
#: Bodies larger than this are parsed off the event loop.
THREAD_PARSE_BYTES = 256 * 1024
#: Bytes of a streamed body handed to its parser at a time, off the event loop.
FEED_BATCH_BYTES = 1024 * 1024
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: What in a JSON text may make a value the wire check refuses: a surrogate escape (a lone
#: surrogate), 19 digits in a row (an integer out of range, a huge mantissa) or an exponent of
#: three digits (a float that overflows). A text without any, nested at most as deep as its
#: brackets allow, holds no such value, so its check is skipped.
_WIRE_RISK = re.compile(rb"\\u[dD][89a-fA-F]|[0-9]{19}|[eE][+-]?[0-9]{3}")
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300


def settings_of(request: Request) -> ServerSettings:
    settings = getattr(request.app.state, "server_settings", None)
    return settings if isinstance(settings, ServerSettings) else ServerSettings()


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON (a missing Content-Type is read as JSON)."""
    value = request.headers.get("content-type")
    if value is None or not value.strip():
        return
    mime = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    if kind == "application" and (subtype == "json" or subtype.endswith("+json")):
        return
    raise UnsupportedMediaType(
        f"Content-Type: {mime or value!r} is not read here; send the request body as JSON with "
        "Content-Type: application/json (curl: -H 'Content-Type: application/json')")


async def read_body(request: Request, settings: ServerSettings) -> bytes:
    """The raw body; 413 over ``max_body_bytes``, 408 slower than ``body_timeout_s``, 503 when
    it does not fit the request's body lease (``request.state.body_lease``, when it has one:
    :mod:`.body_budget`)."""
    chunks: list[bytes] = []
    await stream_body(request, settings, chunks.append)
    return b"".join(chunks)


async def stream_body(request: Request, settings: ServerSettings,
                      take: Callable[[bytes], Awaitable[None] | None]) -> None:
    """Hand the body's chunks to ``take`` as they arrive, under :func:`read_body`'s limits
    (awaiting what it returns, when it returns an awaitable)."""
    limit = settings.max_body_bytes
    lease: BodyLease | None = getattr(request.state, "body_lease", None)
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit():
        if int(declared) > limit:
            raise _too_large(limit)
        if lease is not None:
            lease.cover(int(declared))
    size = 0
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                if lease is not None:
                    lease.cover(size)
                taken = take(chunk)
                if taken is not None:
                    await taken
    except TimeoutError:
        raise RequestTooSlow(
            f"the request body did not arrive within {settings.body_timeout_s:g} s "
            "(server.body_timeout_s); send it faster or raise the limit") from None
    except ClientDisconnect:
        raise BadRequest("the client closed the connection before sending the whole body") \
            from None


async def stream_batches(request: Request, settings: ServerSettings,
                         feed_all: Callable[[list[bytes]], None],
                         batch_bytes: int = FEED_BATCH_BYTES) -> None:
    """Hand the body's chunks to ``feed_all`` (which empties the list it is given) a batch of
    about ``batch_bytes`` at a time, off the event loop (a parser's Python steps per byte or
    per value never hold the loop), under :func:`read_body`'s limits; the last batch on the loop
    when the whole body is small (at most :data:`THREAD_PARSE_BYTES`)."""
    batch: list[bytes] = []
    held = total = 0

    async def take(chunk: bytes) -> None:
        nonlocal held, total
        batch.append(chunk)
        held += len(chunk)
        total += len(chunk)
        if held >= batch_bytes:
            held = 0
            await asyncio.to_thread(feed_all, batch)

    await stream_body(request, settings, take)
    if total > THREAD_PARSE_BYTES:
        await asyncio.to_thread(feed_all, batch)
    else:
        feed_all(batch)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is larger than {limit} bytes "
                           "(server.max_body_bytes); send a smaller body or raise the limit")


def _no_constant(name: str) -> Any:
    raise BadRequest(f"the request body contains {name}, which is not JSON; send a finite "
                     "number or null")


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_DIGITS:
        raise BadRequest(f"the request body contains an integer literal of {digits} digits; "
                         f"integers have at most {len(str(INT_MAX))} digits here")
    return int(text)


def parse_json(raw: bytes | bytearray, max_depth: int,
               max_values: int = ServerSettings.max_json_values,
               runs: RunSplitter | None = None) -> Any:
    """Decode ``raw`` and check it with :func:`check_wire_value`; BadRequest (400) otherwise,
    before parsing when it may hold more than ``max_values`` values. ``runs``: the splitter
    ``raw`` is the reduced text of (its payloads are put back; offsets in errors are the
    body's)."""
    offset = runs.original_offset if runs is not None else (lambda at: at)
    bound = json_values_bound(raw)
    if bound > max_values:
        raise too_many_values(max_values, bound)
    # Payloads set aside (runs) are base64: nothing in them is at risk.
    safe = raw.count(b"[") + raw.count(b"{") <= max_depth and _WIRE_RISK.search(raw) is None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not valid UTF-8: {exc.reason} at byte "
                         f"{offset(exc.start)}; send UTF-8 JSON") from None
    del raw  # the caller's reference is the only one left
    try:
        value = json.loads(text, parse_constant=_no_constant,
                           parse_int=int if safe else _parse_int)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {_where(exc, offset)}") from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # anything else the decoder refuses
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    del text
    if runs is not None:
        value = runs.restore(value)
    if not safe:
        check_wire_value(value, max_depth)
    return value


def _where(exc: json.JSONDecodeError, offset: Callable[[int], int]) -> str:
    """``exc``'s message with the body's line, column and offset (payloads set aside hold no
    line break, so only the column and offset move)."""
    line_start = exc.doc.rfind("\n", 0, exc.pos) + 1
    pos = offset(exc.pos)
    column = pos - offset(line_start) + 1
    return f"{exc.msg}: line {exc.lineno} column {column} (char {pos})"


def json_values_bound(raw: bytes | bytearray) -> int:
    """At least the number of values in the JSON text ``raw`` (the top one, and each array
    item and object member, nested ones included): every item or member but the first of its
    array or object follows a comma, and each array or object opens with a bracket (commas and
    brackets inside strings are counted too). One pass over the bytes per character, in C."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def too_many_values(max_values: int, bound: int | None = None) -> BadRequest:
    """400 for a body of more values (array items and object members) than ``max_values``;
    ``bound``: the upper bound a JSON body was refused on."""
    if bound is None:
        held = f"more than server.max_json_values ({max_values}) values (array items and " \
            "object members)"
    else:
        held = f"up to {bound} values (array items and object members; commas and brackets " \
            f"are counted, also inside strings), more than server.max_json_values ({max_values})"
    return BadRequest(f"the request body holds {held}; send fewer array items or raise the "
                      "limit")


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (an ASCII string, such as a base64
    payload of megabytes, is answered without scanning it)."""
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


def check_depth(value: Any, max_depth: int, field: str | None = None) -> None:
    """400 when ``value`` nests lists or mappings deeper than ``max_depth`` (iterative: any
    depth is safe to check, so recursive code may run on a value that passed); the message
    names ``field`` when given (the value holds that field alone)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise _too_deep(max_depth) if field is None else too_deep_field(field, max_depth)
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))


def _too_deep(max_depth: int) -> BadRequest:
    return BadRequest(f"the request body is nested deeper than {max_depth} levels "
                      "(server.max_json_depth); flatten it or raise the limit")


def too_deep_field(field: str, max_depth: int) -> BadRequest:
    """The 400 of a body nested deeper than ``max_depth`` in ``field``."""
    return BadRequest(f"{field}: nested deeper than {max_depth} levels, the body's own "
                      "included (server.max_json_depth); flatten it or raise the limit")


def _show(text: str) -> str:
    shown = ascii(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def join_path(path: str, key: str) -> str:
    """``path.key`` (``key`` as ``ascii()`` when it is not an identifier)."""
    name = key if key.isidentifier() else ascii(key)
    return f"{path}.{name}" if path else name


def check_wire_value(value: Any, max_depth: int) -> None:
    """400 naming the path of the first value the stage IPC cannot carry, or of nesting deeper
    than ``max_depth``. Iterative, so any depth is safe to check."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        where = path or "the request body"
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                shown = str(item) if abs(item) < 10**40 else f"of {len(str(abs(item)))} digits"
                raise BadRequest(f"{where}: integer {shown} is out of range; integers must lie "
                                 f"between {INT_MIN} and {INT_MAX}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise BadRequest(f"{where}: {item!r} is not a finite number; send a finite "
                                 "number")
        elif isinstance(item, str):
            if lone_surrogate(item):
                raise BadRequest(f"{where}: the string {_show(item)} contains a lone UTF-16 "
                                 "surrogate; send valid Unicode text")
        elif isinstance(item, dict | list):
            if depth > max_depth:
                raise _too_deep(max_depth)
            if isinstance(item, list):
                stack.extend(reversed([(v, f"{path}[{i}]", depth + 1)
                                      for i, v in enumerate(item)]))
                continue
            for key in item:
                if lone_surrogate(key):
                    raise BadRequest(f"{where}: the key {_show(key)} contains a lone UTF-16 "
                                     "surrogate; send valid Unicode keys")
            stack.extend(reversed([(sub, join_path(path, key), depth + 1)
                                   for key, sub in item.items()]))


def parsed_on_loop(request: Request) -> bool:
    """Whether the request's body is small enough (its declared ``Content-Length``) that its
    JSON was parsed on the event loop, and so is what is measured or walked of it next."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and int(declared) <= THREAD_PARSE_BYTES


async def read_json_body(request: Request) -> Any:
    """The checked JSON value of a request's body (see the module contract). Long base64
    payloads are set aside while the body arrives (:mod:`.body_runs`), so the body is held
    about once while it is parsed."""
    settings = settings_of(request)
    check_content_type(request)
    runs = RunSplitter()
    await stream_body(request, settings, runs.feed)
    runs.finish()
    held, runs.text = [runs.text], bytearray()
    if len(held[0]) > THREAD_PARSE_BYTES or runs.runs:
        return await asyncio.to_thread(_parse_taken, held, settings, runs)
    return _parse_taken(held, settings, runs)


def _parse_taken(held: list[bytearray], settings: ServerSettings, runs: RunSplitter) -> Any:
    """:func:`parse_json` of the one item of ``held``, taken from it so the text is dropped as
    soon as it is decoded."""
    return parse_json(held.pop(), settings.max_json_depth, settings.max_json_values, runs)
