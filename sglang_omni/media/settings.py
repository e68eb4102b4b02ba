"""Build a ``MediaPolicy`` from the plain settings a stage process receives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang_omni.media.policy import MediaPolicy


def policy_from_spec(settings: dict[str, Any]) -> MediaPolicy:
    """``{"allowed_local_media_path": str | None, "allowed_media_domain": [str],
    "max_media_parts": int | None, "max_media_bytes": int | None, "fetch_timeout_s": float,
    "fetch_deadline_s": float, "request_deadline_s": float}`` (missing keys: the
    ``MediaPolicy`` defaults, which are the secure ones: no local files, public hosts only)."""
    local = settings.get("allowed_local_media_path")
    timeouts: dict[str, Any] = {k: float(settings[k])
                                for k in ("fetch_timeout_s", "fetch_deadline_s",
                                          "request_deadline_s")
                                if settings.get(k) is not None}
    return MediaPolicy(allowed_local_media_path=Path(local) if local else None,
                       allowed_media_domains=tuple(settings.get("allowed_media_domain") or ()),
                       max_media_parts=settings.get("max_media_parts"),
                       max_media_bytes=settings.get("max_media_bytes"), **timeouts)
