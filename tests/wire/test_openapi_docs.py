"""``/openapi.json`` documents every route's request body with its fields, ``/docs`` and
``/redoc`` render with assets this server serves itself (no CDN), and both stay open when the
server requires an API key. Real servers, one per pipeline."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM, Server
from tests.wire.kit import HTTP

KEY = "docs-test-key"
#: Route -> fields its documented request body must name, per pipeline.
BODIES: dict[str, dict[str, tuple[str, ...]]] = {
    "umm": {"/generate": ("prompt", "messages", "stage_params", "temperature", "stream"),
            "/v1/chat/completions": ("messages", "stream", "stage_params", "top_p", "seed")},
    "chat": {"/v1/chat/completions": ("messages", "response_format", "max_tokens", "stop")},
    "generation": {"/v1/images/generations": ("prompt", "size", "width", "seed",
                                              "num_inference_steps"),
                   "/v1/images/edits": ("prompt", "image", "url", "size", "response_format"),
                   "/v1/videos": ("prompt", "num_frames", "fps", "input_reference", "seconds"),
                   "/v1/actions/generations": ("input", "parameters")},
}
ARGS = {"umm": SCRIPTED_UMM, "chat": SCRIPTED_CHAT, "generation": SCRIPTED_GENERATION}


@pytest.fixture(scope="module", params=sorted(BODIES))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Server]]:
    with Server(*ARGS[request.param], "--api-key", KEY) as server:
        yield request.param, server


def resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    name = ref.rsplit("/", 1)[-1]
    return spec["components"]["schemas"][name]


def test_every_post_route_documents_its_request_body(served: tuple[str, Server]) -> None:
    mode, server = served
    spec = HTTP.get(f"{server.url}/openapi.json").json()  # open without the key
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    assert set(posts) == set(BODIES[mode]), "each pipeline documents exactly its own routes"
    for path, fields in BODIES[mode].items():
        body = posts[path]["requestBody"]
        assert body["required"] is True
        schema = resolve(body["content"]["application/json"]["schema"], spec)
        assert set(fields) <= set(schema["properties"]), (path, sorted(schema["properties"]))
        assert "200" in posts[path]["responses"] and "400" in posts[path]["responses"]


def test_number_fields_are_typed_from_their_rules(served: tuple[str, Server]) -> None:
    mode, server = served
    spec = HTTP.get(f"{server.url}/openapi.json").json()
    path = "/v1/images/generations" if mode == "generation" else "/v1/chat/completions"
    schema = resolve(spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
                     ["schema"], spec)
    props = schema["properties"]
    if mode == "generation":
        assert props["width"]["type"] == "integer" and props["width"]["exclusiveMinimum"] == 0
        assert props["guidance_scale"]["type"] == "number"
    else:
        assert props["temperature"]["type"] == "number"
        assert props["top_k"]["type"] == "integer"
        assert props["messages"]["items"]["properties"]["role"]["enum"] == [
            "system", "user", "assistant", "developer"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_assets_this_server_serves(served: tuple[str, Server],
                                                        page: str) -> None:
    _, server = served
    resp = HTTP.get(f"{server.url}{page}")  # open without the key: a browser sends none
    assert resp.status_code == 200 and "text/html" in resp.headers["content-type"]
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""", resp.text)
    urls += re.findall(r"""spec-url=["']([^"']+)["']""", resp.text)
    found = {u for pair in urls for u in (pair if isinstance(pair, tuple) else (pair,)) if u}
    assert not [u for u in found if "//" in u], f"external assets on {page}: {found}"
    assert "/openapi.json" in found
    scripts = [u for u in found if u.endswith(".js")]
    assert scripts, f"no script on {page}: {found}"
    for url in found:
        asset = HTTP.get(f"{server.url}{url}")
        assert asset.status_code == 200, (url, asset.text[:200])
        assert len(asset.content) > 1000, url
    assert "cdn" not in resp.text.lower()


def test_docs_assets_refuse_other_names(served: tuple[str, Server]) -> None:
    _, server = served
    resp = HTTP.get(f"{server.url}/docs/assets/..%2Fcore.py")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == 404
    assert HTTP.get(f"{server.url}/v1/models").status_code == 401  # the key still guards
