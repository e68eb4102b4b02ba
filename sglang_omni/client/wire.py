"""How the SDK reads a server's answer: a non-200 status becomes :class:`OmniClientError`."""

from __future__ import annotations

import httpx

from sglang_omni.client.types import OmniClientError


def raise_for(resp: httpx.Response) -> None:
    """Raise the server's error (``{"error": {"message", "type", "code"}}``) unless 200."""
    if resp.status_code == 200:
        return
    try:
        error = resp.json()["error"]
        message = str(error["message"])
        if resp.status_code == 401:
            message += " (SDK: pass Client(api_key=KEY) with the server's --api-key)"
        raise OmniClientError(int(error.get("code", resp.status_code)), message,
                              str(error.get("type", "")))
    except (ValueError, KeyError, TypeError):
        raise OmniClientError(resp.status_code, resp.text[:500]) from None
