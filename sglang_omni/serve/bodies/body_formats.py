"""Which body formats a route reads, and the one value each becomes before validation.

A route reads JSON; it also reads a form (multipart, or URL-encoded without uploads) or msgpack
when its OpenAPI request body lists ``multipart/form-data`` or ``application/msgpack``
(:func:`accepts` builds that entry, so the documentation and the reader cannot disagree).
:func:`read_route_body` picks the reader by the request's Content-Type (415 naming the accepted
types otherwise) and returns the value the route's typed model then validates:

* JSON and msgpack: the checked value (:mod:`.request_body`, :mod:`.msgpack_body`);
* a form: an object of its fields. A text field is converted by the type the model declares
  for it (integer, number, boolean, array or object; a string stays text); a field the model
  does not declare is read as JSON when it parses, else kept as text (native's reading); an
  empty field counts as absent. A field sent twice becomes a list when the model declares an
  array of strings (``image[]``-style names drop their ``[]``), else 400; another array
  (``action``) is one JSON text. An upload becomes a ``data:``
  URL of its bytes, so the media policy judges it like any inline media.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import BadRequest, UnsupportedMediaType
from sglang_omni.serve.bodies.body_budget import BodyBudget
from sglang_omni.serve.bodies.msgpack_body import MSGPACK, read_msgpack_body
from sglang_omni.serve.bodies.multipart_body import MULTIPART, URLENCODED, Form, Upload, read_form
from sglang_omni.serve.bodies.request_body import (
    check_content_type,
    check_depth,
    check_wire_value,
    read_json_body,
    too_deep_field,
)
from sglang_omni.serve.bodies.request_body import settings_of as settings_of
from sglang_omni.serve.bodies.upload_url import data_url_of

JSON = "application/json"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def accepts(*formats: str, uploads: tuple[str, ...] = ()) -> dict[str, Any]:
    """``openapi_extra`` for a route that also reads ``formats`` (multipart, msgpack);
    ``uploads`` are the form's file fields."""
    content: dict[str, Any] = {}
    if MULTIPART in formats:
        content[MULTIPART] = {"schema": {
            "type": "object", "additionalProperties": True,
            "properties": {name: {"type": "string", "format": "binary"} for name in uploads}}}
    if MSGPACK in formats:
        content[MSGPACK] = {"schema": {"type": "object", "additionalProperties": True}}
    return {"requestBody": {"content": content}}


def formats_of(openapi_extra: dict[str, Any] | None) -> tuple[str, ...]:
    """The extra body formats an ``openapi_extra`` (of :func:`accepts`) declares."""
    content = ((openapi_extra or {}).get("requestBody") or {}).get("content") or {}
    return tuple(kind for kind in (MULTIPART, MSGPACK) if kind in content)


def format_of(request: Request, extra: tuple[str, ...]) -> str:
    """``json``, or one of ``extra``, by the request's Content-Type; 415 otherwise."""
    mime = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if mime in extra:
        return mime
    if mime == URLENCODED and MULTIPART in extra:
        return MULTIPART
    if not extra:
        check_content_type(request)
        return JSON
    try:
        check_content_type(request)
    except UnsupportedMediaType:
        accepted = ", ".join((JSON, *extra, *((URLENCODED,) if MULTIPART in extra else ())))
        raise UnsupportedMediaType(f"Content-Type: {mime!r} is not read here; send one of "
                                   f"{accepted}") from None
    return JSON


def _convert(key: str, text: str, schema: dict[str, Any] | None, max_depth: int) -> Any:
    kind = (schema or {}).get("type")
    try:
        if kind == "integer":
            return int(text.strip())
        if kind == "number":
            return float(text.strip())
        if kind == "boolean":
            word = text.strip().lower()
            if word in _TRUE or word in _FALSE:
                return word in _TRUE
            raise ValueError(text)
        if kind in ("array", "object") or schema is None:
            value = json.loads(text)
            check_depth({key: value}, max_depth, key)  # as in the body: naming the field
            return value
    except RecursionError:  # nested past what the decoder's recursion allows: too deep anyway
        raise too_deep_field(key, max_depth) from None
    except ValueError:
        if schema is None:
            return text
        shown = {"integer": "an integer", "number": "a number", "boolean": "true or false",
                 "array": "a JSON array", "object": "a JSON object"}.get(str(kind), "JSON")
        raise BadRequest(f"{key}: expected {shown}, got {text[:60]!r}") from None
    return text


def data_url(upload: Upload) -> str:
    """An upload as a ``data:`` URL (:mod:`.upload_url`): the one :func:`read_form` made as its
    bytes arrived, else made of its bytes; its type is the part's, else the one its leading
    bytes show, else guessed from its name (a name's type is never checked against the bytes)."""
    if upload.url is not None:
        return upload.url
    return data_url_of(upload.content_type, upload.filename, upload.data)


def form_value(form: Form, properties: dict[str, dict[str, Any]],
               max_depth: int = ServerSettings.max_json_depth) -> dict[str, Any]:
    """The object a form stands for (see the module contract); ``properties`` are the JSON
    schemas of the route model's fields. A JSON field nested too deep to decode is a 400
    (:func:`~sglang_omni.serve.bodies.request_body.check_wire_value` checks the depth of the
    rest)."""
    out: dict[str, Any] = {}
    items = [(k, v, False) for k, v in form.fields if v != ""]
    items += [(u.name, data_url(u), True) for u in form.files]
    for raw_key, text, upload in items:
        key = raw_key.removesuffix("[]")
        schema = properties.get(key)
        items_schema = (schema or {}).get("items")
        is_list = raw_key.endswith("[]") or (schema or {}).get("type") == "array" and \
            (items_schema or {}).get("type") == "string"
        if upload:
            value: Any = text
        elif is_list:
            value = _convert(key, text, items_schema or {"type": "string"}, max_depth)
        else:
            value = _convert(key, text, schema, max_depth)
        if is_list:
            out.setdefault(key, [])
            if not isinstance(out[key], list):
                raise BadRequest(f"{key}: sent both as a list and as one value")
            out[key].append(value)
        elif key in out:
            raise BadRequest(f"{key}: sent more than once; send one value")
        else:
            out[key] = value
    return out


async def read_route_body(request: Request, extra: tuple[str, ...],
                          properties: dict[str, dict[str, Any]]) -> tuple[str, Any]:
    """(format, value) of a route's body (see the module contract), read and parsed under a
    lease on the app's body budget (:mod:`.body_budget`)."""
    budget = getattr(request.app.state, "body_budget", None)
    if not isinstance(budget, BodyBudget):
        return await _read_route_body(request, extra, properties)
    with budget.lease() as lease:
        request.state.body_lease = lease
        try:
            return await _read_route_body(request, extra, properties)
        finally:
            del request.state.body_lease


async def _read_route_body(request: Request, extra: tuple[str, ...],
                           properties: dict[str, dict[str, Any]]) -> tuple[str, Any]:
    kind = format_of(request, extra)
    if kind == MULTIPART:
        form = await read_form(request)
        max_depth = settings_of(request).max_json_depth
        value = await asyncio.to_thread(form_value, form, properties, max_depth) \
            if form.files else form_value(form, properties, max_depth)
        check_wire_value(value, max_depth)
        return kind, value
    if kind == MSGPACK:
        return kind, await read_msgpack_body(request)
    return JSON, await read_json_body(request)
