"""One translation from a request model's validation errors to the 400 a client reads.

The message is ``"<field path>: <what to change>"`` for the first error, the path written as
the client wrote the body (``messages[0].content``); a body that is not a JSON object reads
"the request body must be a JSON object". Used by the app's ``RequestValidationError`` handler
and by every parser that validates a model itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.request_body import join_path
from sglang_omni.serve.schemas.fields import FIELD_ERROR

NOT_AN_OBJECT = "the request body must be a JSON object"
_OBJECT_TYPES = ("model_type", "model_attributes_type", "dict_type")
M = TypeVar("M", bound=BaseModel)


def path_of(loc: Sequence[Any]) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content`` (FastAPI's "body" dropped)."""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else join_path(path, str(part))
    return path


def _reason(error: Mapping[str, Any]) -> str:
    kind = error.get("type")
    ctx = error.get("ctx") or {}
    if kind == FIELD_ERROR:
        return str(ctx.get("reason", error.get("msg", "invalid value")))
    if kind == "missing":
        return "required"
    if kind in _OBJECT_TYPES:
        return "expected an object"
    if kind == "json_invalid":
        return f"not valid JSON: {ctx.get('error', '')}".rstrip(": ")
    return str(error.get("msg", "invalid value"))


def bad_request_of(errors: Sequence[Mapping[str, Any]]) -> BadRequest:
    """The 400 for the first of ``errors`` (pydantic's ``errors()`` list)."""
    if not errors:
        return BadRequest("the request is invalid")
    first = errors[0]
    path = path_of(first.get("loc", ()))
    if not path:
        if first.get("type") in (*_OBJECT_TYPES, "missing"):  # a list, a string, null
            return BadRequest(NOT_AN_OBJECT)
        return BadRequest(f"the request body: {_reason(first)}")
    reason = _reason(first)
    if reason.startswith(path) and reason[len(path):len(path) + 1] in ("[", ".", ":"):
        return BadRequest(reason)  # the rule named the exact place itself
    return BadRequest(f"{path}: {reason}")


def validate(model: type[M], body: Any) -> M:
    """``body`` (parsed JSON) as a ``model``; the 400 of :func:`bad_request_of` otherwise."""
    if isinstance(body, model):
        return body
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise bad_request_of(exc.errors(include_url=False)) from None
