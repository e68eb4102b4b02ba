"""The media references of a native action-route request body, found and replaced.

The native Cosmos3 action route reads an observation image or video from ``image``,
``image_path``, ``input_reference``, ``video`` or ``video_path``, or from the values of an
``images`` mapping, in the body itself, in ``input``, in ``input.observation`` or in
``parameters``. A string there is a media reference (a path, URL or base64 data) and must pass
the media policy; arrays and ``{"b64_json": ...}`` objects carry the pixels inline.
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


def action_media_refs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, reference)`` of every string media reference in the body."""
    return [(label, slot[0][slot[1]]) for label, slot in _slots(body)]  # type: ignore[index]


def replace_action_media(body: dict[str, Any], replace: Callable[[str, str], str]) -> None:
    """Replace, in place, every string media reference with ``replace(label, reference)``."""
    for label, (holder, key) in list(_slots(body)):
        holder[key] = replace(label, holder[key])  # type: ignore[index]
