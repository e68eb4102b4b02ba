"""Each gateway call is made under a Ray Serve request id of its own (Ray's router matches the
replica it chose to a pending call by that id: two calls of one HTTP request sharing it could
swap replicas), the rest of the HTTP request's context kept."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from ray.serve import context as serve_context  # noqa: E402

from sglang_omni.scale.call_ids import own_id  # noqa: E402


def test_each_call_gets_its_own_request_id_and_the_request_keeps_its_own() -> None:
    serve_context._set_request_context(route="/", request_id="client-1",
                                       _internal_request_id="http-1", app_name="omni")

    def made() -> tuple[str, str, str]:
        ctx = serve_context._get_serve_request_context()
        return ctx._internal_request_id, ctx.request_id, ctx.app_name

    first, second = own_id(made), own_id(made)
    assert first[0] != second[0] and "http-1" not in (first[0], second[0])
    assert first[1:] == second[1:] == ("client-1", "omni")
    assert serve_context._get_serve_request_context()._internal_request_id == "http-1"
