"""Checks on media a generation stage returns before they reach the client or the Reasoner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_omni.contract.result import Frames
from sglang_omni.errors import ServerError
from sglang_omni.media.types import INLINE_LIMIT, MIME_BY_KIND, media_type_of


def check_generated_media(kind: str, payload: Mapping[str, Any], frames: Frames, *,
                          inline_limit: int | None = INLINE_LIMIT) -> tuple[bytes | bytearray, str]:
    """Exactly one item of ``kind`` within ``inline_limit`` bytes (None: no limit, as on the
    direct generation routes) whose bytes are what they claim; ServerError otherwise (the
    request fails). ``payload`` should be an ``contract.payloads.MediaResult``; it comes from
    another process, so its shape is checked here."""
    items = payload.get("media") or []
    if not items:
        reason = payload.get("reason") or "no reason given"
        raise ServerError(f"the {kind} generation ended without media ({reason}); the "
                          "generation stage log has the details")
    if len(items) != 1:
        raise ServerError(f"the {kind} generation returned {len(items)} media items; exactly "
                          "one was expected")
    item = items[0]
    index = item.get("frame")
    if not isinstance(index, int) or not 0 <= index < len(frames):
        raise ServerError(f"the {kind} generation returned a media item without its bytes")
    data = frames[index]
    if inline_limit is not None and len(data) > inline_limit:
        raise ServerError(f"the generated {kind} is {len(data)} bytes, over the "
                          f"{inline_limit // (1024 * 1024)} MiB inline limit")
    declared = item.get("mime_type")
    if item.get("kind") != kind or declared not in MIME_BY_KIND[kind]:
        raise ServerError(f"the {kind} generation returned a {item.get('kind')} item of type "
                          f"{declared}")
    if media_type_of(kind, data) != declared:
        raise ServerError(f"the generated {kind} is malformed: its bytes are not {declared}")
    return data, declared
