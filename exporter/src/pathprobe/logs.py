"""The log format of `pathprobe --log.level LEVEL --log.format logfmt|json`, as Prometheus and its
exporters write their logs (Go's log/slog: `time=... level=... source=... msg=...`, one line per
record, or the same keys as a JSON object), so that one pipeline reads them all."""

from __future__ import annotations

import datetime
import json
import logging

LEVELS = ("debug", "info", "warn", "error")
FORMATS = ("logfmt", "json")


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    fields = {
        "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower().replace("warning", "warn").replace("critical", "error"),
        "source": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info:
        fields["err"] = formatter.formatException(record.exc_info)
    return fields


class Logfmt(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_quoted(value)}" for key, value in _fields(record, self).items())


class Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), ensure_ascii=False)


def _quoted(value: str) -> str:
    """A logfmt value: bare when it needs no quotes, else a JSON string (quotes, backslashes and
    newlines escaped)."""
    if value and not any(c in value for c in ' ="\\') and value.isprintable():
        return value
    return json.dumps(value, ensure_ascii=False)


def setup(level: str, fmt: str) -> None:
    """Every record of the process to standard error, in `fmt`, from `level` up."""
    handler = logging.StreamHandler()
    handler.setFormatter(Json() if fmt == "json" else Logfmt())
    logging.basicConfig(
        level=logging.WARNING if level == "warn" else getattr(logging, level.upper()), handlers=[handler], force=True
    )
