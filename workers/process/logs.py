"""One JSON object per log line, with stable field names that alerts and tests rely on.

Fields: ``ts``, ``level``, ``event``, ``worker_id``, ``attempt``,
``duration_ms``, ``status``, ``error_code``, ``trace_id``, ``span_id``,
``workflow_id``, ``run_id``, ``activity_id``, ``tenant``,
``idempotency_key`` (absent fields are omitted; ``ts``, ``level``, ``event``
and ``logger`` are always there). A line written inside a trace carries that
trace's ``trace_id`` and ``span_id`` even when its logger knows nothing of
tracing (the SDK's own loggers, libraries). Configured secret values and
credentials are redacted wherever they appear. Temporal Core's own (Rust)
log lines are forwarded into Python logging by ``workers.process.telemetry`` so they
come out here too, instead of as plain text on stderr.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from aiworker.activities.call_telemetry import attempt_log_fields
from aiworker.activities.redaction import REDACTED, Redactor

__all__ = ["REDACTED", "JsonFormatter", "Redactor", "configure_logging"]

STABLE_FIELDS = (
    "ts",
    "level",
    "event",
    "worker_id",
    "attempt",
    "duration_ms",
    "status",
    "error_code",
    "trace_id",
    "span_id",
    "workflow_id",
    "run_id",
    "activity_id",
    "tenant",
    "idempotency_key",
)


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object per line.

    Args:
        redactor: removes secrets from every line (default: credential patterns only).
    """

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redact = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        doc = self.fields(record)
        return self.redact(json.dumps(self.redact.value(doc), default=str, ensure_ascii=False))

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The line's fields, not yet redacted (the OTLP log records use them too)."""
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "aiworker", None)
        if isinstance(fields, dict):
            doc.update({k: v for k, v in fields.items() if v is not None})
        message = record.getMessage()
        doc.setdefault("event", message)
        if doc["event"] != message:
            doc["message"] = message
        # Temporal's loggers attach workflow/activity info as `temporal_*` extras.
        wf = getattr(record, "temporal_workflow", None)
        if isinstance(wf, dict):
            doc.setdefault("workflow_id", wf.get("workflow_id"))
            doc.setdefault("run_id", wf.get("run_id"))
        act = getattr(record, "temporal_activity", None)
        if isinstance(act, dict):
            doc.setdefault("workflow_id", act.get("workflow_id"))
            doc.setdefault("run_id", act.get("workflow_run_id"))
            doc.setdefault("activity_id", act.get("activity_id"))
            doc.setdefault("attempt", act.get("attempt"))
        if doc.get("trace_id") is None:
            sc = trace.get_current_span().get_span_context()
            if sc.is_valid:
                doc["trace_id"] = format(sc.trace_id, "032x")
                doc["span_id"] = format(sc.span_id, "016x")
            else:
                # After an attempt's spans closed (the SDK's own outcome line).
                for k, v in attempt_log_fields().items():
                    doc.setdefault(k, v)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return {k: v for k, v in doc.items() if v is not None}


def configure_logging(
    level: str = "INFO", secrets: Iterable[str] = (), stream: Any = None
) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) as JSON lines; returns the handler."""
    secrets = list(secrets)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(Redactor(secrets)))
    root = logging.getLogger()
    for h in list(root.handlers):
        # The OTLP log handler (workers.process.otlp) outlives a reconfiguration,
        # and redacts what the new JSON lines redact.
        if not getattr(h, "keep_on_reconfigure", False):
            root.removeHandler(h)
        elif isinstance(h.formatter, JsonFormatter):
            h.formatter.redact = Redactor([*h.formatter.redact.secrets, *secrets])
    root.addHandler(handler)
    root.setLevel(level)
    # The SDK's own chatter at INFO is useful; httpx logs every request at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return handler


def redact_also(secrets: Iterable[str]) -> None:
    """Add ``secrets`` (known only once tools are built) to every JSON log handler."""
    extra = [s for s in secrets if s]
    if not extra:
        return
    for h in logging.getLogger().handlers:
        f = h.formatter
        if isinstance(f, JsonFormatter):
            f.redact = Redactor([*f.redact.secrets, *extra])
