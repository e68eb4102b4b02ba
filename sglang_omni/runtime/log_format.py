"""The log format of the server and its stage processes: text (the default) or one JSON object
per line (``--log-format json``), for log collectors.

A JSON line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; a stage
process's lines add ``stage``; the per-request line (``serve.request_log``) adds its fields
(``rid``, ``route``, ``status``, ``outcome``, ``turns``, ``generations``, ``segments``,
``bytes``, ``duration_s``, ``first_segment_s``) as keys.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s [{role}] %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (``fields`` added to each); see the module docstring."""

    def __init__(self, fields: dict[str, str] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        body = {"ts": ts, "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), **self.fields}
        fields = getattr(record, "omni_fields", None)
        if isinstance(fields, dict):
            body.update(fields)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure_logging(level: str, fmt: str = "text", role: str = "server",
                      stage: str | None = None) -> None:
    """Configure the root logger of this process (``fmt``: one of :data:`LOG_FORMATS`;
    ``role`` names the process in text lines: ``server``, or ``replica`` in a fleet; a stage
    process passes its ``stage`` name)."""
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter({"stage": stage} if stage else None))
        logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
        return
    text = TEXT_FORMAT.format(role=role) if stage is None \
        else f"%(asctime)s [{stage} stage] %(levelname)s %(message)s"
    logging.basicConfig(level=level.upper(), format=text)
