"""Cosmos3 as the HTTP layer sees it (``contract.model.ServedModel``): its generation defaults
and size multiples, and its native action route's reading, checks and metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_omni.contract import actions
from sglang_omni.contract.model import ServedModel
from sglang_omni.models.cosmos3 import action_metadata, action_request
from sglang_omni.models.cosmos3.generation_limits import (
    ACTION_DEFAULTS,
    NATIVE_DEFAULTS,
    SIZE_MULTIPLE_BY_BACKEND,
)


class Cosmos3Model(ServedModel):
    """NVIDIA Cosmos3 (Nano): native 1280x720 defaults, the hf backend's multiple of 16, and
    the native action route."""

    name = "Cosmos3"
    defaults = NATIVE_DEFAULTS
    action_defaults = ACTION_DEFAULTS
    size_multiples = SIZE_MULTIPLE_BY_BACKEND

    def check_action_request(self, body: dict[str, Any],
                             check_media: Callable[..., Any]) -> dict[str, Any]:
        return action_request.check_action_request(body, check_media)

    def action_response_format(self, body: dict[str, Any]) -> str:
        return action_request.response_format(body)

    def action_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        return actions.action_fields(body)

    def plan_action(self, fields: dict[str, Any]) -> None:
        actions.plan_action(fields)

    def action_metadata(self, served_name: str, model_path: str | None, backend: str,
                        engine_args: dict[str, Any]) -> dict[str, Any]:
        return action_metadata.action_metadata(served_name, model_path, backend, engine_args)


COSMOS3: Cosmos3Model = Cosmos3Model()
