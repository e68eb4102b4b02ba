"""Building blocks of the wire models: a base model and fields checked by a rule's one home."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from sglang_omni.errors import BadRequest

#: The pydantic error type of a field a rule refused; its ``reason`` is what to change.
FIELD_ERROR = "omni_field"


class WireModel(BaseModel):
    """A request body: unknown fields are kept (the route refuses them with its own hint) and
    every value stays exactly as sent (no coercion: a rule checks it)."""

    model_config = ConfigDict(extra="allow")


def refuse(reason: str) -> PydanticCustomError:
    """The validation error of a field, with ``reason`` saying what to change."""
    return PydanticCustomError(FIELD_ERROR, "{reason}", {"reason": reason})


@dataclass(frozen=True)
class Checked:
    """Field metadata (``Annotated[Any, Checked(...)]``): any JSON value that passes ``rule``
    (which raises BadRequest; None checks nothing), documented by ``schema``. A message that
    starts with ``"<key>: "`` loses that prefix (the 400 names the field path itself). ``None``
    is not checked: null means unset, except for a field that ``null_is_unset`` False makes
    required even as null (``rule`` then judges null too)."""

    rule: Callable[[Any], object] | None
    schema: dict[str, Any]
    key: str = ""
    null_is_unset: bool = True

    def validate(self, value: Any) -> Any:
        if value is None and self.null_is_unset or self.rule is None:
            return value
        try:
            self.rule(value)
        except BadRequest as exc:
            message = exc.message
            raise refuse(message.removeprefix(f"{self.key}: ") if self.key else message) \
                from None
        return value

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return dict(self.schema)


def checked(rule: Callable[[Any], object], schema: dict[str, Any], key: str = "",
            null_is_unset: bool = True) -> Checked:
    """See :class:`Checked`."""
    return Checked(rule, schema, key, null_is_unset)


def documented(schema: dict[str, Any], description: str = "") -> Checked:
    """A field passed on as sent (the route or native SGLang checks it), documented."""
    return Checked(None, {**schema, "description": description} if description else schema)


def typed(kind: type, schema: dict[str, Any]) -> Checked:
    """A field that must hold a ``kind`` (never a bool for int/float), documented by ``schema``."""
    names = {str: "a string", bool: "true or false", dict: "an object", list: "a list",
             int: "an integer"}

    def rule(value: Any) -> None:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            shown = type(value).__name__ if kind is str else repr(value)[:60]
            raise BadRequest(f"expected {names[kind]}, got {shown}")

    return checked(rule, schema)


STRING = typed(str, {"type": "string"})
BOOLEAN = typed(bool, {"type": "boolean"})
OBJECT = typed(dict, {"type": "object"})
