"""The worker protocol: the envelopes every AI worker speaks.

A worker is called with a :class:`WorkerRequest` and either returns a
:class:`WorkerResponse` or fails with ``ApplicationError(type=<ErrorCode>,
details=[ErrorInfo])``. Models evolve by adding optional fields only.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, PlainSerializer, field_validator

from aiworker.schemas.base import Model
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.names import DEFAULT_TENANT, TENANT_PATTERN

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


class TraceContext(Model):
    """W3C trace identifiers carried with a request (lower-case hex)."""

    trace_id: str = Field(description="32 hex digits")
    span_id: str = Field(description="16 hex digits")
    parent_span_id: str | None = Field(default=None, description="16 hex digits")

    @field_validator("trace_id")
    @classmethod
    def _trace_id(cls, v: str) -> str:
        if not _HEX32.match(v) or v == "0" * 32:
            raise ValueError("trace_id must be 32 lower-case hex digits, not all zero")
        return v

    @field_validator("span_id", "parent_span_id")
    @classmethod
    def _span_id(cls, v: str | None) -> str | None:
        if v is not None and (not _HEX16.match(v) or v == "0" * 16):
            raise ValueError("span ids must be 16 lower-case hex digits, not all zero")
        return v

    @classmethod
    def from_traceparent(cls, header: Any) -> TraceContext | None:
        """The ids of a W3C ``traceparent`` header (``00-<trace>-<span>-<flags>``), or None."""
        if not isinstance(header, str):
            return None
        parts = header.strip().split("-")
        if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
            return None
        trace_id, span_id = parts[1], parts[2]
        if not _HEX32.match(trace_id) or not _HEX16.match(span_id):
            return None
        if trace_id == "0" * 32 or span_id == "0" * 16:
            return None
        return cls(trace_id=trace_id, span_id=span_id)


class RequestConstraints(Model):
    """Per-request overrides; each may only tighten the worker spec."""

    timeout_seconds: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=0)
    tools_allowed: list[str] | None = None
    max_external_calls: int | None = Field(default=None, ge=0)


# The longest a step may keep reusing a cached result: 30 days.
MAX_CACHE_TTL_SECONDS = 30 * 24 * 3600


class CachePolicy(Model):
    """A step's cache: reuse a stored result of the same worker, spec version,
    tenant and input for ``ttl_seconds``."""

    ttl_seconds: int = Field(
        ge=1,
        le=MAX_CACHE_TTL_SECONDS,
        description="how long a stored result is reused, in seconds (1 to 2592000, 30 days)",
    )


class WorkerRequest(Model):
    """One call of one worker."""

    worker_id: str = Field(min_length=1)
    version: str = Field(default="1", description="contract version of the worker spec")
    idempotency_key: str = Field(
        min_length=1,
        max_length=512,
        description="the same for every retry of one step: {workflow_id}/{step_id}[/{item}]",
    )
    step_id: str | None = Field(
        default=None, max_length=256, description="the pipeline step this call runs (lineage, logs)"
    )
    tenant: str = Field(default=DEFAULT_TENANT, pattern=TENANT_PATTERN)
    trace: TraceContext | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    constraints: RequestConstraints = Field(default_factory=RequestConstraints)
    cache: CachePolicy | None = Field(
        default=None,
        description="the step's cache: a stored result within the TTL is returned without "
        "running the worker; a succeeded result is stored",
    )


class WarningInfo(Model):
    """A non-fatal finding, e.g. a field a partial result is missing."""

    code: str
    message: str
    field: str | None = None


class ArtifactRef(Model):
    """A large output stored out of band."""

    uri: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0)
    media_type: str = "application/octet-stream"


def usd_text(value: Decimal) -> str:
    """``value`` as a plain decimal string: no exponent, no trailing zeros (``"0.00042"``)."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


# Money is a Decimal, summed exactly across any number of steps and attempts
# (binary floats drift: 0.1 + 0.2 != 0.3), and written to JSON as a decimal
# string: a JSON number would be read back as a float by most clients (jq,
# JavaScript, json.loads), losing the exactness the sum kept. Input takes a
# JSON number or a decimal string.
Usd = Annotated[
    Decimal,
    Field(ge=0, allow_inf_nan=False),
    PlainSerializer(usd_text, return_type=str, when_used="json"),
]


class Usage(Model):
    """What a call consumed; summed by the pipeline's budget ledger."""

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    external_calls: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(
        default=0,
        ge=0,
        description="input tokens the provider read from its prompt cache (part of "
        "input_tokens), priced at the cached-input price",
    )
    cache_write_tokens: int = Field(
        default=0,
        ge=0,
        description="input tokens the provider wrote to its prompt cache (Anthropic; part of "
        "input_tokens), priced at the cache-write price",
    )
    cost_usd: Usd = Field(
        default=Decimal(0),
        description="what the model calls cost in US dollars, from the model alias's prices "
        "(a decimal string; 0 for an alias without prices)",
    )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            external_calls=self.external_calls + other.external_calls,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


class Observability(Model):
    """Where to find this call in traces and logs."""

    trace_id: str | None = None
    span_id: str | None = None
    worker_id: str
    attempt: int = Field(default=1, ge=1)
    duration_ms: float = Field(default=0.0, ge=0)
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="the deadline this attempt ran under (spec, tightened)"
    )


class WorkerResponse(Model):
    """A successful (or partial) result of a worker call."""

    worker_id: str
    version: str
    status: Literal["succeeded", "partial"]
    outputs: dict[str, Any] = Field(default_factory=dict)
    warnings: list[WarningInfo] = Field(default_factory=list)
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    observability: Observability
    cached: bool = Field(
        default=False,
        description="the outputs come from the step cache (the worker did not run)",
    )


class ErrorInfo(Model):
    """The details of a failure, attached to the ``ApplicationError``."""

    code: ErrorCode
    message: str
    retryable: bool
    worker_id: str | None = None
    field: str | None = None
    retry_after_seconds: float | None = None
    reasons: list[dict[str, Any]] = Field(
        default_factory=list, description="machine-actionable reasons, e.g. validator errors"
    )
    context: dict[str, Any] = Field(default_factory=dict)
    usage: Usage | None = Field(
        default=None,
        description="what the call consumed before it failed, every attempt so far included",
    )
