"""The parts of ``/openapi.json`` that depend on this server's settings, not on the code alone.

The request models are built once, at import; a setting that narrows what a field accepts is
applied to the generated schema here, so the schema lists what this server takes:
``x264_preset``'s enum is ``server.allowed_x264_presets`` (a request naming another preset gets
400), not all of x264's presets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from sglang_omni.config.server import ServerSettings

X264_PRESET_NOTE = ("the x264 preset of the video encode; this server allows only these "
                    "(server.allowed_x264_presets)")


def narrow_to_settings(schema: dict[str, Any], settings: ServerSettings) -> dict[str, Any]:
    """``schema`` (an OpenAPI document), changed in place and returned: every ``x264_preset``
    property lists the server's allowed presets."""

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and isinstance(props.get("x264_preset"), dict):
                props["x264_preset"] = {**props["x264_preset"],
                                        "enum": list(settings.allowed_x264_presets),
                                        "description": X264_PRESET_NOTE}
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def serve_narrowed_openapi(app: FastAPI, settings: ServerSettings) -> None:
    """Make ``app.openapi()`` return the schema narrowed to ``settings`` (built once, cached
    by FastAPI like its own)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        schema = build()
        return narrow_to_settings(schema, settings) if fresh else schema

    app.openapi = openapi  # type: ignore[method-assign]
