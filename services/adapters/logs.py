"""JSON log lines with a fixed key vocabulary, so on-call can grep one workload's story.

    log = bind(logging.getLogger(__name__), workload_uid=uid, namespace=ns)
    log.info("quota reserved", decision="admit", cluster_queue="gpu-queue")

A key outside VOCABULARY raises: a typo in a log key would otherwise hide the line from every query.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

VOCABULARY = frozenset(
    {
        "service", "workload_uid", "namespace", "cluster_queue", "cohort", "event_id", "event_type",
        "decision", "reason", "topic", "partition", "offset", "error", "count", "duration_s", "detail",
    }
)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(getattr(record, "qm_fields", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class BoundLogger(logging.LoggerAdapter):
    """A logger carrying fields; each call may add more (checked against VOCABULARY)."""

    def process(self, msg, kwargs):
        fields = dict(self.extra)
        for key in list(kwargs):
            if key not in ("exc_info", "stack_info", "stacklevel", "extra"):
                fields[key] = kwargs.pop(key)
        _check(fields)
        kwargs["extra"] = {"qm_fields": fields}
        return msg, kwargs

    def bind(self, **fields) -> BoundLogger:
        _check(fields)
        return BoundLogger(self.logger, {**self.extra, **fields})


def bind(logger: logging.Logger, **fields) -> BoundLogger:
    _check(fields)
    return BoundLogger(logger, fields)


def _check(fields: dict) -> None:
    unknown = set(fields) - VOCABULARY
    if unknown:
        raise ValueError(f"log keys {sorted(unknown)} are not in the vocabulary {sorted(VOCABULARY)}")


def configure(service: str, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # faust and aiokafka are chatty at INFO; their warnings still show.
    for noisy in ("faust", "aiokafka", "mode"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def format_as_json(logger: logging.Logger, service: str) -> None:
    """Give every handler of `logger` the JSON format, after a library set up its own (faust's
    worker replaces the root handlers with a text format that drops every field)."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter(service))
