"""The server process's log format: text (the default) or one JSON object per line
(``--log-format json``), for log collectors.

A JSON line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; the per-request
line (:mod:`.request_log`) adds its fields (``rid``, ``route``, ``status``, ``outcome``,
``turns``, ``generations``, ``segments``, ``bytes``, ``duration_s``, ``first_segment_s``) as
keys. Stage processes keep the text format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s [{role}] %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        body = {"ts": ts, "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        fields = getattr(record, "omni_fields", None)
        if isinstance(fields, dict):
            body.update(fields)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure_logging(level: str, fmt: str = "text", role: str = "server") -> None:
    """Configure the root logger of the server process (``fmt``: one of :data:`LOG_FORMATS`;
    ``role`` names the process in text lines: ``server``, or ``replica`` in a fleet)."""
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
        return
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT.format(role=role))
