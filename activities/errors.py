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

:func:`map_failures` is that boundary, in one place (httpx's
``map_exceptions`` is the model): whatever a worker call raises leaves it as
an ``ApplicationError`` with a stable code, without secrets::

    WorkerError                       -> its code (retry_after -> next_retry_delay)
    ApplicationError, a stable type   -> kept as it is
    ApplicationError, any other type  -> internal
    any other Exception               -> internal (the traceback goes to the log line)
    asyncio.CancelledError            -> not mapped: Temporal's cancellation
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from temporalio.exceptions import ApplicationError

from aiworker.activities.redaction import Redactor
from aiworker.schemas.errors import ErrorCode, is_retryable
from aiworker.schemas.protocol import ErrorInfo

STABLE_CODES = frozenset(c.value for c in ErrorCode)


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


def code_of(exc: BaseException) -> str:
    """The stable code a failure raised out of a worker call carries (``internal`` if none)."""
    if isinstance(exc, WorkerError):
        return exc.code.value
    if isinstance(exc, ApplicationError) and exc.type in STABLE_CODES:
        return exc.type
    return ErrorCode.INTERNAL.value


@dataclass(frozen=True)
class Failure:
    """What an exception becomes at the activity boundary.

    Attributes:
        error: the ``ApplicationError`` Temporal records (``type`` is the stable code).
        cause: chained as its ``__cause__`` (None when it would leak a secret).
        why: fields for the call's log line: ``error``, ``retry_after_seconds``,
            ``traceback``.
    """

    error: ApplicationError
    cause: BaseException | None
    why: dict[str, Any] = field(default_factory=dict)


def to_failure(exc: Exception, worker_id: str, attempt: int) -> Failure:
    """The boundary's table: the :class:`Failure` that ``exc`` becomes (see the module doc)."""
    if isinstance(exc, WorkerError):
        why: dict[str, Any] = {"error": exc.message}
        if exc.retry_after is not None:
            why["retry_after_seconds"] = exc.retry_after
        return Failure(exc.to_application_error(worker_id, attempt), exc, why)
    if isinstance(exc, ApplicationError) and exc.type in STABLE_CODES:
        # A worker raised Temporal's error itself: kept, since its code is stable.
        return Failure(exc, exc.__cause__, {"error": exc.message})
    if isinstance(exc, ApplicationError):
        internal = InternalError(f"unexpected ApplicationError: {exc}")
        why = {"error": str(exc)}
    else:
        internal = InternalError(
            f"internal error in worker {worker_id}: {type(exc).__name__}: {exc}"
        )
        why = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc)),
        }
    return Failure(internal.to_application_error(worker_id, attempt), exc, why)


def redacted(failure: Failure, redactor: Redactor) -> Failure:
    """``failure`` without secrets (its error goes into workflow history), and a safe cause.

    Messages built from exceptions may quote a configured secret (an API key
    in a URL, an echoed header). The error keeps its code, retry behaviour
    and details, with every string redacted; a cause that quotes a secret is
    dropped rather than serialized beside it.
    """
    error, cause = failure.error, failure.cause
    message = redactor(error.message)
    details = [redactor.value(d) for d in error.details]
    cause_leaks = cause is not None and (
        redactor.contains_secret(str(cause)) or redactor(str(cause)) != str(cause)
    )
    if message == error.message and details == list(error.details) and not cause_leaks:
        return failure
    keep_cause = not cause_leaks and message == error.message
    return Failure(replaced(error, message, details), cause if keep_cause else None, failure.why)


def replaced(error: ApplicationError, message: str, details: list[Any]) -> ApplicationError:
    """``error`` with another message and details; code and retry behaviour kept."""
    return ApplicationError(
        message,
        *details,
        type=error.type,
        non_retryable=error.non_retryable,
        next_retry_delay=error.next_retry_delay,
        category=error.category,
    )


@contextlib.contextmanager
def map_failures(
    worker_id: str,
    attempt: int,
    *,
    redactor: Redactor,
    on_failure: Callable[[Failure], ApplicationError] = lambda f: f.error,
) -> Iterator[None]:
    """Raise whatever the block raises as a redacted ``ApplicationError`` with a stable code.

    ``on_failure`` sees each :class:`Failure` before it is raised and returns
    the error to raise (the runtime notes ``why`` for the log line and adds
    the call's usage to the details). Cancellation passes through untouched.
    """
    try:
        yield
    except Exception as exc:
        failure = redacted(to_failure(exc, worker_id, attempt), redactor)
        error = on_failure(failure)
        if error is exc:
            raise
        raise error from failure.cause
