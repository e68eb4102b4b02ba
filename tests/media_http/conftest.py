"""The loopback media hosts the media-route tests fetch from (127.0.0.1 and 127.0.0.2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.media.media_http_server import MediaServer, serving


@pytest.fixture(scope="module")
def hosts() -> Iterator[MediaServer]:
    with serving() as host:
        yield host
