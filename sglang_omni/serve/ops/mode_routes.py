"""What each pipeline mode serves: a router, the resources it owns, and the refusals of the
routes another mode serves (400 naming the route to use instead, after the body is read)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Body

from sglang_omni.errors import BadRequest, NotFound
from sglang_omni.serve.wire.validation import NOT_AN_OBJECT


@dataclass(frozen=True)
class ModeRoutes:
    """A mode's routes; ``closers`` end what they own (video jobs) at server shutdown, before
    the stages stop."""

    router: APIRouter
    closers: tuple[Callable[[], Awaitable[None]], ...] = ()


def refuse_chat(router: APIRouter, message: str) -> None:
    """``POST /v1/chat/completions`` answers 400 ``message`` on this mode."""

    @router.post("/v1/chat/completions", include_in_schema=False)
    async def chat_not_here(_: Any = Body(None)) -> None:
        raise BadRequest(message)


def refuse_generate(router: APIRouter, config_cls: str) -> None:
    """``POST /generate`` answers 400 on a mode other than the interleaved pipeline."""

    @router.post("/generate", include_in_schema=False)
    async def generate_not_here(body: Any = Body(None)) -> None:
        if not isinstance(body, dict):
            raise BadRequest(NOT_AN_OBJECT)
        if body.get("stream"):
            raise BadRequest("/generate: stream=true is served only by the interleaved "
                             "pipeline (Cosmos3UMMPipelineConfig); set stream to false")
        raise BadRequest(f"/generate is served by the interleaved pipeline; this server runs "
                         f"{config_cls}")


def check_model(requested: Any, served_name: str) -> None:
    """404 (OpenAI's answer to an unknown model) unless ``requested`` is unset or the served
    model's name (``--model-name``, else the checkpoint path; ``GET /v1/models`` lists it)."""
    if requested is None or requested == served_name:
        return
    raise NotFound(f"model: {requested!r} is not served here; this server serves "
                   f"{served_name!r} (GET /v1/models): send that name or leave model unset")
