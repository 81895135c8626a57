"""Worker specs: the published contract of each AI worker.

One JSON file per worker lives in ``schemas/workers/``; :func:`load_specs`
reads and checks them (JSON Schema 2020-12 for ``input_schema`` and
``output_schema``). Reading happens on first use, never on import.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PERIOD_SECONDS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
}


def parse_rate(text: str) -> tuple[int, float]:
    """Parse ``"10/min"`` into ``(10, 60.0)`` (``"5/20s"`` into ``(5, 20.0)``)."""
    m = _RATE.match(text)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"rate {text!r} is not of the form N/s, N/min, N/hour or N/<k>s")
    scale = float(m.group(2)) if m.group(2) else 1.0
    if scale <= 0:
        raise ValueError(f"rate {text!r} has an empty period")
    return int(m.group(1)), scale * _PERIOD_SECONDS[m.group(3)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecConstraints(_Model):
    """The limits a worker runs under; requests may only tighten them."""

    timeout_seconds: float = Field(gt=0, le=86400)
    max_tokens: int | None = Field(default=None, ge=0)
    tools_allowed: list[str] = Field(default_factory=list)
    max_external_calls: int | None = Field(default=None, ge=0)
    rate_limit: str | None = Field(default=None, description='per tenant, e.g. "10/min"')

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rate(v)
        return v


class RetrySpec(_Model):
    """How Temporal retries the worker's retryable failures."""

    max_attempts: int = Field(ge=1, le=100)
    backoff: Literal["exponential", "fixed"] = "exponential"
    initial_interval_ms: int = Field(default=1000, ge=1)
    max_interval_ms: int = Field(default=60000, ge=1)

    @model_validator(mode="after")
    def _intervals(self) -> RetrySpec:
        if self.max_interval_ms < self.initial_interval_ms:
            raise ValueError("max_interval_ms must be >= initial_interval_ms")
        return self


class ObservabilitySpec(_Model):
    """Which input fields a worker's log line carries."""

    log_fields: list[str] = Field(default_factory=list)


class WorkerSpec(_Model):
    """The contract of one AI worker."""

    worker_id: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    version: str
    purpose: str
    task_queue: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    constraints: SpecConstraints
    retries: RetrySpec
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    heartbeat_seconds: float | None = Field(
        default=None, gt=0, description="heartbeat timeout for long work; None for short workers"
    )

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as e:
            raise ValueError(f"not a valid JSON Schema 2020-12: {e.message}") from e
        return v


@functools.cache
def load_specs() -> dict[str, WorkerSpec]:
    """Read every ``schemas/workers/*.json`` once; keyed by worker id."""
    specs: dict[str, WorkerSpec] = {}
    folder = Path(__file__).parent / "workers"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        try:
            spec = WorkerSpec.model_validate(json.loads(entry.read_text("utf-8")))
        except ValueError as e:
            raise ValueError(f"worker spec {entry.name}: {e}") from e
        if f"{spec.worker_id}.json" != entry.name:
            raise ValueError(f"worker spec {entry.name} declares worker_id {spec.worker_id!r}")
        specs[spec.worker_id] = spec
    return specs


def get_spec(worker_id: str) -> WorkerSpec:
    """The spec of one worker; ``KeyError`` names the known ones."""
    specs = load_specs()
    try:
        return specs[worker_id]
    except KeyError:
        raise KeyError(f"unknown worker {worker_id!r}; known: {', '.join(sorted(specs))}") from None
