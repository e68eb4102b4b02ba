"""The media references of a native action-route request body, found and replaced.

The native Cosmos3 action route reads an observation image or video from ``image``,
``image_path``, ``input_reference``, ``video`` or ``video_path``, or from the values of an
``images`` mapping, in the body itself, in ``input``, in ``input.observation`` or in
``parameters``. A string there is a media reference (a path, URL or base64 data) and must pass
the media policy; arrays and ``{"b64_json": ...}`` objects carry the pixels inline (the latter
are found by :func:`action_inline_images`, so their bytes are checked like inline references).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

MEDIA_KEYS = ("image", "image_path", "input_reference", "video", "video_path")
Slot = tuple[dict[str, Any] | list[Any], str | int]


def _containers(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "", body
    given = body.get("input")
    if isinstance(given, dict):
        yield "input.", given
        if isinstance(given.get("observation"), dict):
            yield "input.observation.", given["observation"]
    if isinstance(body.get("parameters"), dict):
        yield "parameters.", body["parameters"]


def _slots(body: dict[str, Any]) -> Iterator[tuple[str, Slot]]:
    for prefix, container in _containers(body):
        for key in MEDIA_KEYS:
            value = container.get(key)
            if isinstance(value, str):
                yield f"{prefix}{key}", (container, key)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, str):
                        yield f"{prefix}{key}[{i}]", (value, i)
        images = container.get("images")
        if isinstance(images, dict):
            for name, item in images.items():
                if isinstance(item, str):
                    yield f"{prefix}images.{name}", (images, name)


def _inline_text(value: Any) -> tuple[str, str] | None:
    """(``b64_json`` or ``base64``, the text) of an inline image object; None for another."""
    if not isinstance(value, dict):
        return None
    key = "b64_json" if "b64_json" in value else "base64"
    text = value.get(key)
    return (key, text) if isinstance(text, str) else None


def action_inline_images(body: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` of every image the body carries inline as ``{"b64_json": text}`` (or
    ``{"base64": text}``; a ``data:`` URL or bare base64), labelled ``input.image.b64_json``."""
    out: list[tuple[str, str]] = []
    for prefix, container in _containers(body):
        values = [(f"{prefix}{key}", container.get(key)) for key in MEDIA_KEYS]
        images = container.get("images")
        if isinstance(images, dict):
            values += [(f"{prefix}images.{name}", item) for name, item in images.items()]
        for label, value in values:
            items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                found = _inline_text(item)
                if found is not None:
                    where = label if i is None else f"{label}[{i}]"
                    out.append((f"{where}.{found[0]}", found[1]))
    return out


def action_media_refs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, reference)`` of every string media reference in the body."""
    return [(label, slot[0][slot[1]]) for label, slot in _slots(body)]  # type: ignore[index]


def replace_action_media(body: dict[str, Any], replace: Callable[[str, str], str]) -> None:
    """Replace, in place, every string media reference with ``replace(label, reference)``."""
    for label, (holder, key) in list(_slots(body)):
        holder[key] = replace(label, holder[key])  # type: ignore[index]
