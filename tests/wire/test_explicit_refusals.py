"""What used to be ignored silently is refused or documented: a ``model`` that is not the served
name is a 404 in the OpenAI error shape (as OpenAI and vLLM answer), ``--demo --text-only``
serves the text-only pipeline on the tiny checkpoint, and length settings on the interleaved
pipeline are documented as ignored in the API schema."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from sglang_omni import cli
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server
from tests.wire.kit import HELLO, HTTP, error_of


@pytest.fixture(scope="module")
def named() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--model-name", "cosmos3") as server:
        yield server


@pytest.fixture(scope="module")
def chat() -> Iterator[Server]:
    with Server(*SCRIPTED_CHAT, "--model-name", "reasoner") as server:
        yield server


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**HELLO, "model": "gpt-4o"}),
    ("/v1/chat/completions", {**HELLO, "model": "gpt-4o", "stream": True}),
    ("/generate", {"prompt": "hi", "model": "gpt-4o"}),
    ("/generate", {"prompt": "hi", "model": "gpt-4o", "stream": True}),
])
def test_an_unknown_model_is_404_in_the_openai_shape(named: Server, path: str,
                                                      body: dict) -> None:
    resp = HTTP.post(f"{named.url}{path}", json=body)
    assert resp.status_code == 404
    error = error_of(resp)
    assert error["type"] == "not_found_error"
    assert "'gpt-4o' is not served here" in error["message"] and "'cosmos3'" in error["message"]


def test_the_served_name_and_no_name_are_accepted(named: Server) -> None:
    assert HTTP.post(f"{named.url}/generate", json={"prompt": "hi", "model": "cosmos3"},
                     timeout=30).status_code == 200
    assert HTTP.post(f"{named.url}/generate", json={"prompt": "hi"},
                     timeout=30).status_code == 200
    assert HTTP.get(f"{named.url}/v1/models").json()["data"][0]["id"] == "cosmos3"


def test_text_only_chat_refuses_an_unknown_model_too(chat: Server) -> None:
    client = openai.OpenAI(base_url=f"{chat.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=HELLO["messages"])
    assert client.chat.completions.create(model="reasoner", messages=HELLO["messages"]).choices


def test_demo_text_only_serves_the_reasoner_alone_on_the_hf_backend() -> None:
    args, extra = cli.build_parser().parse_known_args(
        ["serve", "--demo", "--text-only", "--model-path", "/models/tiny"])
    config = cli._resolve(args, extra)
    assert config.config_cls == "Cosmos3ReasonerPipelineConfig"
    assert list(config.stages) == ["reasoner"]
    reasoner = config.stage("reasoner")
    assert reasoner.factory["backend"] == "hf" and reasoner.gpu is None


def test_demo_refuses_direct_with_text_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--demo", "--direct", "--text-only", "--port", "0"]) == 2
    assert "--direct and --text-only: choose one" in capsys.readouterr().err


def test_length_settings_are_documented_as_ignored_by_the_interleaved_pipeline(
        named: Server) -> None:
    schema = HTTP.get(f"{named.url}/openapi.json").json()["components"]["schemas"]
    fields = schema["ChatCompletionRequest"]["properties"]
    for key in ("max_tokens", "max_completion_tokens", "stop", "min_tokens", "ignore_eos"):
        assert "interleaved pipeline: accepted and ignored" in fields[key]["description"], key
