"""Which HTTP paths serve the service itself rather than a model request: the one home of the
"poll / service path" rule.

- **Polls** (:func:`is_poll`): ``/health``, ``/v1/queue``, ``/metrics``, ``/favicon.ico`` and the
  static assets of the playground and the API docs. Monitors and an open playground fetch them
  every second or so: they are counted in the metrics but not logged at INFO, neither by Omni's
  request log nor by uvicorn's access log (``sgl-omni serve --log-polls`` logs them), and not
  counted as requests being served.
- **Open** (:func:`is_open`): served without the API key: ``/health``, the API docs
  (``/docs``, ``/redoc``, ``/openapi.json`` and their assets) and the playground page (``/``,
  ``/playground`` and its assets), which a browser loads without a bearer header and which hold
  no secret.
- **Service** (:func:`is_service`): not a model request, so not counted in a replica's
  ``in_flight`` (the fleet's routers read it): the polls, the open paths, ``/v1/models`` and
  ``/server_info``.
"""

from __future__ import annotations

#: Paths polled by monitors and the playground.
POLL_PATHS = frozenset({"/health", "/v1/queue", "/metrics", "/favicon.ico"})
#: The static assets of the playground and the API docs.
ASSET_PREFIXES = ("/docs/assets/", "/playground/assets/")
#: The API documentation pages and the schema they read.
DOC_PATHS = frozenset({"/docs", "/redoc", "/openapi.json"})
#: The playground page.
PAGE_PATHS = frozenset({"/", "/playground"})


def is_poll(path: str) -> bool:
    """Whether a request to ``path`` is a poll or a static asset (not logged at INFO)."""
    return path in POLL_PATHS or path.startswith(ASSET_PREFIXES)


def is_open(path: str) -> bool:
    """Whether ``path`` is served without the API key."""
    return path == "/health" or path in DOC_PATHS or path in PAGE_PATHS \
        or path.startswith(ASSET_PREFIXES)


def is_service(path: str) -> bool:
    """Whether a request to ``path`` is not a model request."""
    return is_poll(path) or is_open(path) or path in ("/v1/models", "/server_info")
