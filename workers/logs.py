"""One JSON object per log line, with the stable field names of DESIGN.md.

Fields: ``ts``, ``level``, ``event``, ``worker_id``, ``attempt``,
``duration_ms``, ``status``, ``error_code``, ``trace_id``, ``span_id``,
``workflow_id``, ``run_id``, ``activity_id``, ``tenant``,
``idempotency_key`` (absent fields are omitted). Configured secret values
and credentials are redacted wherever they appear.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

_CREDENTIALS = re.compile(
    r"(?i)(authorization|x-api-key|api[_-]?key|bearer)([\"']?\s*[:=]\s*[\"']?|\s+)"
    r"([A-Za-z0-9._~+/=-]{6,})"
)
REDACTED = "[REDACTED]"


class Redactor:
    """Removes secret values and credential-looking pairs from text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, REDACTED)
        return _CREDENTIALS.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object per line."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redact = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "aiworker", None)
        if isinstance(fields, dict):
            doc.update({k: v for k, v in fields.items() if v is not None})
        doc.setdefault("event", record.getMessage())
        if doc["event"] != record.getMessage():
            doc["message"] = record.getMessage()
        # Temporal's loggers attach workflow/activity info as `temporal_*` extras.
        for attr, key in (("temporal_workflow", "workflow"), ("temporal_activity", "activity")):
            extra = getattr(record, attr, None)
            if isinstance(extra, dict):
                doc.setdefault("workflow_id", extra.get("workflow_id"))
                doc.setdefault("run_id", extra.get("run_id"))
                if key == "activity":
                    doc.setdefault("activity_id", extra.get("activity_id"))
                    doc.setdefault("attempt", extra.get("attempt"))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        doc = {k: v for k, v in doc.items() if v is not None}
        return self.redact(json.dumps(doc, default=str, ensure_ascii=False))


def configure_logging(level: str = "INFO", secrets: Iterable[str] = (), stream: Any = None) -> None:
    """Send every log record to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(Redactor(secrets)))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    # The SDK's own chatter at INFO is useful; httpx logs every request at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
