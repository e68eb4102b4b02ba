"""A media refusal raised in a stage names the field as the client sent it: the Reasoner's
messages start with Omni's instructions and carry top-level ``images``/``videos`` and a
``/generate`` prompt as content parts, none of which the client wrote."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.kit import script
from tests.media.media_http_server import PNG, MediaServer
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import final


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--allowed-media-domain", "127.0.0.1") as srv:
        yield srv


def message_of(resp: httpx.Response) -> str:
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]["message"]


def test_top_level_images_are_named_as_sent(server: Server, hosts: MediaServer) -> None:
    missing = hosts.url("127.0.0.1", "/missing")
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": script(final("{media}"))}],
        "images": [missing]})
    assert "images[0]" in message_of(chat) and "messages[" not in message_of(chat)
    generate = httpx.post(f"{server.url}/generate", timeout=30, json={
        "prompt": script(final("{media}")), "images": [missing]})
    assert "images[0]" in message_of(generate) and "messages[" not in message_of(generate)


def test_native_sglang_never_sees_the_label_key(tmp_path) -> None:
    """The part handed to native SGLang is the client's part, without Omni's label."""
    import asyncio

    from sglang_omni.engines.native.reasoner_request import localize_media
    from sglang_omni.media.content_parts import CLIENT_LABEL_KEY
    from sglang_omni.media.policy import MediaPolicy
    from sglang_omni.media.workdir import RequestMediaDir
    from sglang_omni.serve.chat.chat_request import parse_chat_request

    (tmp_path / "cube.png").write_bytes(PNG)
    req = parse_chat_request({"messages": [{"role": "user", "content": "look"}],
                              "images": [str(tmp_path / "cube.png")]})
    assert req.messages[0]["content"][1][CLIENT_LABEL_KEY] == "images[0]"
    policy = MediaPolicy(allowed_local_media_path=str(tmp_path))

    async def localize() -> list:
        with RequestMediaDir() as workdir:
            return await localize_media(req.messages, [], policy, workdir)

    part = asyncio.run(localize())[0]["content"][1]
    assert CLIENT_LABEL_KEY not in part and part["type"] == "image_url"
