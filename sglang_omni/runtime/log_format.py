"""The log format of the server and its stage processes: text (the default) or one JSON object
per line (``--log-format json``), for log collectors.

A JSON line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; a stage
process's lines add ``stage``; the per-request line (``serve.request_log``) adds its fields
(``rid``, ``route``, ``status``, ``outcome``, ``turns``, ``generations``, ``segments``,
``bytes``, ``duration_s``, ``first_segment_s``) as keys.

Native SGLang's processes under a stage (the Reasoner's scheduler and detokenizer) configure
their own logging when they start, from the logging config file named by
``SGLANG_LOGGING_CONFIG_PATH`` when it is set. A stage logging JSON sets it, unless the
environment names a config already, to :data:`NATIVE_JSON_CONFIG` (for itself and so for the
processes it starts), whose handler (:func:`native_json_handler`) writes the stage's JSON
lines: a log collector reads native's records too. Native's generation workers read no such
file; their lines stay text.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s [{role}] %(levelname)s %(name)s: %(message)s"
#: Native SGLang's variable naming a ``logging.config.dictConfig`` file (JSON).
NATIVE_CONFIG_ENV = "SGLANG_LOGGING_CONFIG_PATH"
NATIVE_JSON_CONFIG = Path(__file__).with_name("native_json_logging.json")
#: The stage and level a native process's JSON lines carry (a config file cannot say them).
STAGE_ENV = "SGLANG_OMNI_LOG_STAGE"
LEVEL_ENV = "SGLANG_OMNI_LOG_LEVEL"


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
        if stage is not None:  # a config the environment names already is the user's
            os.environ.setdefault(NATIVE_CONFIG_ENV, str(NATIVE_JSON_CONFIG))
            os.environ.update({STAGE_ENV: stage, LEVEL_ENV: level.upper()})
        return
    text = TEXT_FORMAT.format(role=role) if stage is None \
        else f"%(asctime)s [{stage} stage] %(levelname)s %(message)s"
    logging.basicConfig(level=level.upper(), format=text)


def native_json_handler() -> logging.Handler:
    """The handler :data:`NATIVE_JSON_CONFIG` gives a native process: JSON lines on stderr with
    the stage named by ``SGLANG_OMNI_LOG_STAGE``. Also sets the root logger's level from
    ``SGLANG_OMNI_LOG_LEVEL`` (the config file leaves it alone), so native logs at the stage's
    level."""
    stage = os.environ.get(STAGE_ENV)
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter({"stage": stage} if stage else None))
    level = os.environ.get(LEVEL_ENV, "")
    if level in logging.getLevelNamesMapping():
        logging.getLogger().setLevel(level)
    return handler
