"""Worker exceptions, one per stable error code.

Every exception a worker raises on purpose is a :class:`WorkerError`; the
runtime turns it into ``ApplicationError(type=<code>, non_retryable=...,
next_retry_delay=..., details=[ErrorInfo])`` at the activity boundary, so
Temporal's retry policy does the retrying and the history shows each
attempt. Anything else is a bug and becomes ``internal``::

    WorkerError
    ├── InvalidInputError        invalid_input      (field)
    ├── InvalidOutputError       invalid_output     (field, reasons)
    ├── WorkerTimeoutError       timeout            (timeout_seconds)
    ├── RateLimitedError         rate_limited       (retry_after)
    ├── CircuitOpenError         circuit_open       (target, retry_after)
    ├── FetchTimeoutError        fetch_timeout      (url)
    ├── FetchFailedError         fetch_failed       (url, status_code)
    ├── UpstreamError            upstream_error     (status_code)
    ├── AccessDeniedError        access_denied      (url, status_code)
    ├── NotFoundError            not_found          (url, status_code)
    ├── EgressDeniedError        egress_denied      (url, address)
    ├── PayloadTooLargeError     payload_too_large  (limit_bytes)
    ├── ToolNotAllowedError      tool_not_allowed   (tool)
    ├── BudgetExceededError      budget_exceeded    (resource)
    ├── ValidationFailedError    validation_failed  (reasons)
    └── InternalError            internal
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from temporalio.exceptions import ApplicationError

from aiworker.schemas.errors import ErrorCode, is_retryable
from aiworker.schemas.protocol import ErrorInfo


class WorkerError(Exception):
    """A failure with a stable error code."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retry_after: float | None = None,
        reasons: list[dict[str, Any]] | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.reasons = reasons or []
        self.context = context
        for k, v in context.items():
            setattr(self, k, v)

    @property
    def retryable(self) -> bool:
        return is_retryable(self.code)

    def info(self, worker_id: str | None = None, attempt: int | None = None) -> ErrorInfo:
        context = {k: _jsonable(v) for k, v in self.context.items()}
        if attempt is not None:
            context["attempt"] = attempt
        return ErrorInfo(
            code=self.code,
            message=self.message,
            retryable=self.retryable,
            worker_id=worker_id,
            field=self.field,
            retry_after_seconds=self.retry_after,
            reasons=self.reasons,
            context=context,
        )

    def to_application_error(
        self, worker_id: str | None = None, attempt: int | None = None
    ) -> ApplicationError:
        delay = None
        if self.retryable and self.retry_after is not None and self.retry_after > 0:
            delay = timedelta(seconds=self.retry_after)
        return ApplicationError(
            self.message,
            self.info(worker_id, attempt).model_dump(mode="json"),
            type=self.code.value,
            non_retryable=not self.retryable,
            next_retry_delay=delay,
        )


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


class InvalidInputError(WorkerError):
    code = ErrorCode.INVALID_INPUT


class InvalidOutputError(WorkerError):
    code = ErrorCode.INVALID_OUTPUT


class WorkerTimeoutError(WorkerError):
    code = ErrorCode.TIMEOUT


class RateLimitedError(WorkerError):
    code = ErrorCode.RATE_LIMITED


class CircuitOpenError(WorkerError):
    code = ErrorCode.CIRCUIT_OPEN


class FetchTimeoutError(WorkerError):
    code = ErrorCode.FETCH_TIMEOUT


class FetchFailedError(WorkerError):
    code = ErrorCode.FETCH_FAILED


class UpstreamError(WorkerError):
    code = ErrorCode.UPSTREAM_ERROR


class AccessDeniedError(WorkerError):
    code = ErrorCode.ACCESS_DENIED


class NotFoundError(WorkerError):
    code = ErrorCode.NOT_FOUND


class EgressDeniedError(WorkerError):
    code = ErrorCode.EGRESS_DENIED


class PayloadTooLargeError(WorkerError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class ToolNotAllowedError(WorkerError):
    code = ErrorCode.TOOL_NOT_ALLOWED


class BudgetExceededError(WorkerError):
    code = ErrorCode.BUDGET_EXCEEDED


class ValidationFailedError(WorkerError):
    code = ErrorCode.VALIDATION_FAILED


class InternalError(WorkerError):
    code = ErrorCode.INTERNAL


ERROR_CLASSES: dict[ErrorCode, type[WorkerError]] = {
    cls.code: cls
    for cls in (
        InvalidInputError,
        InvalidOutputError,
        WorkerTimeoutError,
        RateLimitedError,
        CircuitOpenError,
        FetchTimeoutError,
        FetchFailedError,
        UpstreamError,
        AccessDeniedError,
        NotFoundError,
        EgressDeniedError,
        PayloadTooLargeError,
        ToolNotAllowedError,
        BudgetExceededError,
        ValidationFailedError,
        InternalError,
    )
}
