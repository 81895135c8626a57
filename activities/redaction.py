"""Redaction of secrets from text that leaves the process (logs, failures).

Configured secret values (``Settings.secret_values()``) are replaced wherever
they appear, also in their JSON-escaped form, and credential-looking pairs
(``Authorization: ...``, ``api_key=...``, ``Bearer ...``) lose their value
even when the value is not a configured secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_CREDENTIALS = re.compile(
    r"(?i)(authorization|x-api-key|api[_-]?key|bearer)([\"']?\s*[:=]\s*[\"']?|\s+)"
    r"((?:bearer\s+|basic\s+)?[A-Za-z0-9._~+/=-]{6,})"
)
REDACTED = "[REDACTED]"

# Shorter values would redact ordinary words; real keys are far longer.
MIN_SECRET_LENGTH = 4


class Redactor:
    """Removes secret values and credential-looking pairs from text.

    Args:
        secrets: values to remove wherever they appear.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        # A secret with quotes or backslashes looks different inside JSON text.
        values |= {json.dumps(s)[1:-1] for s in values}
        self.secrets = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, REDACTED)
        return _CREDENTIALS.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)

    def contains_secret(self, text: str) -> bool:
        """Whether ``text`` holds a configured secret value."""
        return any(s in text for s in self.secrets)

    def value(self, v: Any) -> Any:
        """``v`` with every string inside it (dict keys too) redacted."""
        if isinstance(v, str):
            return self(v)
        if isinstance(v, dict):
            return {self.value(k): self.value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        return v
