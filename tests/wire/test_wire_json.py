"""Media bodies encoded a window at a time (``serve.wire_json``) are exactly ``json.dumps``'s
output: the long base64 URLs spliced in, everything else (escapes included) as before."""

from __future__ import annotations

import base64
import json
import os

from sglang_omni.serve.wire.wire_json import SPLICE_MIN, WINDOW, base64_url, dumps, dumps_bytes


def test_base64_url_is_the_data_url_of_the_bytes() -> None:
    for size in (0, 1, WINDOW - 1, WINDOW, WINDOW + 1, 3 * WINDOW + 2):
        data = os.urandom(size)
        assert base64_url("video/mp4", data) == \
            "data:video/mp4;base64," + base64.b64encode(data).decode()


def test_bodies_with_long_media_encode_as_json_dumps_does() -> None:
    big = base64_url("video/mp4", os.urandom(2 * WINDOW + 7))
    assert len(big) >= SPLICE_MIN
    body = {"text": 'quote " backslash \\ lone \ud800 \u00e9', "n": [1, 2.5, None, True],
            "segments": [{"data": {"url": big}}, {"data": {"url": big}},
                         {"data": {"url": base64_url("image/png", b"tiny")}}],
            "last": (big, "x")}
    assert dumps(body) == json.dumps(body)
    assert bytes(dumps_bytes(body)) == json.dumps(body).encode()
    assert dumps_bytes({"small": 1}) == json.dumps({"small": 1}).encode()
