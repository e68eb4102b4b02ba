"""Build a ``MediaPolicy`` from the plain settings a stage process receives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang_omni.media.policy import MediaPolicy


def policy_from_spec(settings: dict[str, Any]) -> MediaPolicy:
    """``{"allowed_local_media_path": str | None, "allowed_media_domain": [str]}``."""
    local = settings.get("allowed_local_media_path")
    return MediaPolicy(allowed_local_media_path=Path(local) if local else None,
                       allowed_media_domains=tuple(settings.get("allowed_media_domain") or ()))
