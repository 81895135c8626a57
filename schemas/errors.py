"""Stable error codes of the worker protocol.

Codes are added, never renamed: workflows, alerts and dashboards route on
them. ``RETRYABLE`` says which are retried (docs/reference/errors.md, generated
from this module); every activity retry policy derives its
``non_retryable_error_types`` from it (see ``schemas.options``).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """The stable error codes a worker or workflow fails with."""

    INVALID_INPUT = "invalid_input"
    INVALID_OUTPUT = "invalid_output"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    CIRCUIT_OPEN = "circuit_open"
    FETCH_TIMEOUT = "fetch_timeout"
    FETCH_FAILED = "fetch_failed"
    UPSTREAM_ERROR = "upstream_error"
    ACCESS_DENIED = "access_denied"
    NOT_FOUND = "not_found"
    EGRESS_DENIED = "egress_denied"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    BUDGET_EXCEEDED = "budget_exceeded"
    VALIDATION_FAILED = "validation_failed"
    CALLBACK_FAILED = "callback_failed"
    TOO_MANY_FAILURES = "too_many_failures"
    FLOW_REFUSED = "flow_refused"
    QUOTE_NOT_ACCEPTED = "quote_not_accepted"
    INTERNAL = "internal"


RETRYABLE: dict[ErrorCode, bool] = {
    ErrorCode.INVALID_INPUT: False,
    ErrorCode.INVALID_OUTPUT: False,
    ErrorCode.TIMEOUT: True,
    ErrorCode.RATE_LIMITED: True,
    ErrorCode.CIRCUIT_OPEN: True,
    ErrorCode.FETCH_TIMEOUT: True,
    ErrorCode.FETCH_FAILED: True,
    ErrorCode.UPSTREAM_ERROR: True,
    ErrorCode.ACCESS_DENIED: False,
    ErrorCode.NOT_FOUND: False,
    ErrorCode.EGRESS_DENIED: False,
    ErrorCode.PAYLOAD_TOO_LARGE: False,
    ErrorCode.TOOL_NOT_ALLOWED: False,
    ErrorCode.BUDGET_EXCEEDED: False,
    ErrorCode.VALIDATION_FAILED: False,
    ErrorCode.CALLBACK_FAILED: False,
    ErrorCode.TOO_MANY_FAILURES: False,
    ErrorCode.FLOW_REFUSED: False,
    ErrorCode.QUOTE_NOT_ACCEPTED: False,
    ErrorCode.INTERNAL: True,
}


def is_retryable(code: ErrorCode | str) -> bool:
    """Whether Temporal may retry a failure with this code."""
    return RETRYABLE[ErrorCode(code)]


NON_RETRYABLE_CODES: tuple[str, ...] = tuple(c.value for c in ErrorCode if not RETRYABLE[c])
