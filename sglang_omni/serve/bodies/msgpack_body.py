"""msgpack bodies and messages, as the native action route and its WebSocket speak them.

Reading (:func:`read_msgpack_body` for a request, :func:`decode_msgpack` for a WebSocket
message) has the JSON body's contract (:mod:`.request_body`): 413/408 from the one body reader,
then a value of at most ``server.max_json_values`` values (counted as it is built), nested at
most ``server.max_json_depth`` deep, whose every value the stage IPC can carry (400 naming the
path). Native's numpy arrays (a map ``{"__ndarray__": true, "data": bytes,
"dtype", "shape"}``, keys as text or bytes) become ``{"values", "dtype", "shape"}`` (the native
action route's tensor payload), checked first: a known numeric dtype, a shape whose size matches
the bytes. Other binary values are refused, except where the caller allows them by path.

Writing (:func:`pack_msgpack`) turns action ``values`` into native's array maps (float32, bytes
keys), as native answers a client that asked for msgpack.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection
from typing import Any

import msgpack
import numpy as np
from starlette.requests import Request

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.msgpack_runs import StringSplitter
from sglang_omni.serve.bodies.request_body import (
    THREAD_PARSE_BYTES,
    check_depth,
    check_wire_value,
    join_path,
    settings_of,
    stream_batches,
    too_many_values,
)

MSGPACK = "application/msgpack"
_NUMERIC_KINDS = "biuf"


def _key(obj: dict[Any, Any], name: str) -> Any:
    return obj.get(name, obj.get(name.encode()))


def _array(obj: dict[Any, Any], where: str) -> dict[str, Any]:
    """A native ndarray map as ``{"values", "dtype", "shape"}``; 400 when it is inconsistent."""
    data, dtype, shape = _key(obj, "data"), _key(obj, "dtype"), _key(obj, "shape")
    try:
        kind = np.dtype(dtype.decode() if isinstance(dtype, bytes) else dtype)
    except (TypeError, ValueError):
        raise BadRequest(f"{where}.dtype: {str(dtype)[:40]!r} is not a numpy dtype") from None
    if kind.kind not in _NUMERIC_KINDS:
        raise BadRequest(f"{where}.dtype: {kind.str} is not a numeric dtype")
    if not isinstance(data, bytes) or not isinstance(shape, list | tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"{where}: a numpy array needs bytes data and a shape of sizes")
    if math.prod(shape) * kind.itemsize != len(data):
        raise BadRequest(f"{where}: shape {list(shape)} of {kind.str} needs "
                         f"{math.prod(shape) * kind.itemsize} bytes, got {len(data)}")
    values = np.frombuffer(data, dtype=kind).reshape(shape).tolist()
    return {"values": values, "dtype": kind.str, "shape": list(shape)}


def _scalar(obj: dict[Any, Any], where: str) -> Any:
    value = _key(obj, "data")
    if isinstance(value, bool | int | float):
        return value
    raise BadRequest(f"{where}: a numpy scalar needs a number")


def from_native(value: Any, binary_ok: Collection[str] = (), where: str = "") -> Any:
    """``value`` with native's numpy maps replaced; 400 for other binary data (allowed at the
    paths in ``binary_ok``) and for keys that are not text."""
    if isinstance(value, dict):
        if _key(value, "__ndarray__"):
            return _array(value, where or "the request body")
        if _key(value, "__npgeneric__"):
            return _scalar(value, where or "the request body")
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadRequest(f"{where or 'the request body'}: map keys must be text, got "
                                 f"{type(key).__name__}")
            out[key] = from_native(item, binary_ok, join_path(where, key))
        return out
    if isinstance(value, list):
        return [from_native(item, binary_ok, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, bytes) and where not in binary_ok:
        raise BadRequest(f"{where or 'the request body'}: binary data is read only as a numpy "
                         'array ({"__ndarray__": true, "data", "dtype", "shape"})')
    return value


class _ValueCount:
    """Counts the values of a msgpack body as its arrays and maps are built (the unpacker's
    hooks); BadRequest past ``limit``, so a body of millions of tiny maps stops early."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 1

    def _add(self, n: int) -> None:
        self.count += n
        if self.count > self.limit:
            raise too_many_values(self.limit)

    def array(self, items: list[Any]) -> list[Any]:
        self._add(len(items))
        return items

    def map(self, pairs: dict[Any, Any]) -> dict[Any, Any]:
        self._add(len(pairs))
        return pairs


def decode_msgpack(raw: bytes | bytearray, max_depth: int, binary_ok: Collection[str] = (),
                   max_values: int = ServerSettings.max_json_values,
                   strings: StringSplitter | None = None) -> Any:
    """Decode and check one msgpack value (see the module contract): at most ``max_values``
    values (an array or map longer than that is refused before it is built). ``strings``: the
    splitter ``raw`` is the text of (its long strings are put back in their places)."""
    count = _ValueCount(max_values)
    hook = {} if strings is None else {"ext_hook": strings.ext_hook}
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False, list_hook=count.array,
                                object_hook=count.map, max_array_len=max_values,
                                max_map_len=max_values, **hook)
    except (msgpack.exceptions.StackError, RecursionError):  # StackError has no message
        raise _nested_too_deeply(max_depth) from None
    except (ValueError, TypeError) as exc:  # msgpack's own errors are ValueErrors
        if "exceeds max_" in str(exc):  # one array or map longer than the limit
            raise too_many_values(max_values) from None
        raise BadRequest(f"the body is not valid msgpack: {exc}") from None
    check_depth(value, max_depth)  # first: from_native recurses
    value = from_native(value, binary_ok)
    check_wire_value(value, max_depth)
    return value


def _nested_too_deeply(max_depth: int) -> BadRequest:
    """The 400 of a body nested deeper than msgpack's reader goes (its own limit, about a
    thousand levels; nothing past ``max_depth`` is taken anyway)."""
    return BadRequest(f"the msgpack body is nested deeper than {max_depth} levels "
                      "(server.max_json_depth); flatten it")


async def read_msgpack_body(request: Request) -> Any:
    """The checked value of a msgpack request body. Long strings are set aside while the body
    arrives (:mod:`.msgpack_runs`), so the body is held about once while it is decoded."""
    settings = settings_of(request)
    strings = StringSplitter(max_values=settings.max_json_values)
    await stream_batches(request, settings, strings.feed_all)  # a Python step per value
    strings.finish()
    held, strings.text = [strings.text], bytearray()
    if len(held[0]) > THREAD_PARSE_BYTES or strings.strings:
        return await asyncio.to_thread(_decode_taken, held, settings, strings)
    return _decode_taken(held, settings, strings)


def _decode_taken(held: list[bytearray], settings: ServerSettings,
                  strings: StringSplitter) -> Any:
    """:func:`decode_msgpack` of the one item of ``held``, taken from it so the text is dropped
    once decoded; the strings set aside are let go once in the value."""
    try:
        return decode_msgpack(held.pop(), settings.max_json_depth, (), settings.max_json_values,
                              strings)
    finally:
        strings.strings.clear()


def wants_msgpack(request: Request) -> bool:
    """Whether the client sent msgpack or asked for it (native's test: the Content-Type or the
    Accept header names it). The body's format is ``request.state.body_format``."""
    sent = getattr(request.state, "body_format", None) == MSGPACK
    return sent or "msgpack" in request.headers.get("accept", "").lower()


def native_array(values: Any) -> dict[bytes, Any]:
    """A float32 array map as native packs one."""
    array = np.asarray(values, dtype=np.float32)
    return {b"__ndarray__": True, b"data": array.tobytes(), b"dtype": array.dtype.str,
            b"shape": list(array.shape)}


def with_native_arrays(response: dict[str, Any]) -> dict[str, Any]:
    """An action response whose ``data[*].action.values`` are native array maps."""
    data = [{**item, "action": {**item["action"],
                                "values": native_array(item["action"]["values"])}}
            if isinstance(item, dict) and isinstance(item.get("action"), dict) else item
            for item in response.get("data") or []]
    return {**response, "data": data} if "data" in response else response


def pack_msgpack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)
