"""How a pipeline run ends, for Temporal and for everyone who reads it back.

A run that ends ``succeeded`` or ``partial`` completes its workflow execution
with its :class:`~aiworker.schemas.pipeline.PipelineResult`. A run that ends
in any other terminal status but ``cancelled`` (``failed``, ``rejected``,
``escalation_timed_out``, ``budget_exhausted``) fails its workflow execution
with the :class:`~temporalio.exceptions.ApplicationError` of
:func:`pipeline_failure`: its ``type`` the stable error code
(:func:`failure_code`), its message one line naming the status, the step and
the code, non-retryable, and its ``details`` the result as JSON (``[result]``).
So the Temporal UI shows the run Failed and counts it under Failures, the
``temporal`` CLI finds it with ``ExecutionStatus="Failed"``, and a caller of
``execute_workflow`` gets a ``WorkflowFailureError`` with that cause. A
cancelled run is a cancelled execution: the workflow lets the cancellation
propagate.

:func:`result_from_failure` is the way back, and the one every reader of an
ended run takes (``aiworker run``, redrive, items, evals, the cost quote, the
front door, :class:`~aiworker.workers.client.client.PipelineClient`): from a
``WorkflowFailureError`` (or the ``ApplicationError`` under it, or a
``ChildWorkflowError``) to the ``PipelineResult`` it carries; for a failure
that carries none (an invalid pipeline, a cancel, a terminate, a timeout), a
result built from the failure: status ``failed`` (``cancelled`` for a
cancel), no steps, and ``error`` with its code, message and problems.

Pure: no I/O, usable inside the workflow sandbox.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import ValidationError
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    FailureError,
    TerminatedError,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from aiworker.schemas import names
from aiworker.schemas.causes import PipelineError
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.pipeline import PipelineResult, TerminalStatus

__all__ = [
    "COMPLETING_STATUSES",
    "carried_result",
    "completes",
    "failure_code",
    "failure_message",
    "pipeline_failure",
    "result_from_failure",
]

COMPLETING_STATUSES: Final = names.OK_STATUSES
"""The terminal statuses whose run completes its workflow execution."""

# The code of a run whose status says more than its first failing step's code:
# a budget refusal ends the run whatever step failed first.
_CODE_OF_STATUS: Final[dict[str, str]] = {
    "budget_exhausted": ErrorCode.BUDGET_EXCEEDED.value,
}
# When a run that did not succeed names no error (it always should), the code
# its status implies.
_FALLBACK_CODE: Final[dict[str, str]] = {
    "failed": ErrorCode.INTERNAL.value,
    "rejected": ErrorCode.VALIDATION_FAILED.value,
    "escalation_timed_out": ErrorCode.TIMEOUT.value,
}
# One line in the UI's list and the CLI: the full story is in the details.
MAX_MESSAGE_CHARS: Final = 500
# How deep a reader looks for the workflow's own failure (WorkflowFailureError
# -> ChildWorkflowError -> ApplicationError is the deepest it goes).
_MAX_DEPTH: Final = 4


def completes(status: str) -> bool:
    """Whether a run that ended ``status`` completes its workflow execution
    (``succeeded``, ``partial``); every other status fails it or cancels it."""
    return status in COMPLETING_STATUSES


def failure_code(result: PipelineResult) -> str:
    """The stable error code a run that did not succeed fails with: the code its
    ``error`` carries (the first failing step's), except ``budget_exceeded`` for
    ``budget_exhausted``."""
    by_status = _CODE_OF_STATUS.get(result.status)
    if by_status is not None:
        return by_status
    if result.error is not None and result.error.code:
        return result.error.code
    return _FALLBACK_CODE.get(result.status, ErrorCode.INTERNAL.value)


def failure_message(result: PipelineResult) -> str:
    """One line saying what failed: the status, the step and the code, then the
    error's own message (``failed: step 'products' fetch_failed: ...``)."""
    error = result.error
    code = failure_code(result)
    where = f"step {error.step!r} " if error is not None and error.step else ""
    said = f"{result.status}: {where}{code}"
    if error is not None and error.message:
        said += f": {error.message}"
    line = " ".join(said.split())
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 1] + "…"
    return line


def pipeline_failure(result: PipelineResult) -> ApplicationError:
    """The failure a run that ended ``result`` (not ``succeeded``, ``partial`` nor
    ``cancelled``) fails its workflow execution with."""
    return ApplicationError(
        failure_message(result),
        # the model, so the payload converter writes it as the completion's result
        # would be written (compact: schemas/wire.py)
        result,
        type=failure_code(result),
        non_retryable=True,
    )


def _workflow_failure(error: BaseException) -> BaseException:
    """The failure the workflow itself ended with, under the client's wrappers."""
    current = error
    for _ in range(_MAX_DEPTH):
        if isinstance(
            current, ApplicationError | CancelledError | TerminatedError | TemporalTimeoutError
        ):
            return current
        cause = getattr(current, "cause", None)
        if not isinstance(cause, BaseException):
            return current
        current = cause
    return current


def carried_result(error: BaseException) -> PipelineResult | None:
    """The ``PipelineResult`` a failed run carries in its failure's details, or
    None when the failure carries none (an invalid pipeline, a cancel, a
    terminate, a run that failed on code older than this)."""
    failure = _workflow_failure(error)
    if not isinstance(failure, ApplicationError):
        return None
    for detail in failure.details:
        if isinstance(detail, PipelineResult):
            return detail
        # an invalid pipeline's detail is {"code", "problems"}: no status
        if isinstance(detail, dict) and "status" in detail:
            try:
                return PipelineResult.model_validate(detail)
            except ValidationError:
                return None
    return None


def result_from_failure(error: BaseException) -> PipelineResult:
    """The ``PipelineResult`` of a run whose workflow execution did not complete.

    Args:
        error: what the client raised (``WorkflowFailureError``), or its cause.

    Returns:
        The result the failure carries; for one that carries none, a result with
        status ``failed`` (``cancelled`` for a cancelled run), no steps, and
        ``error`` from the failure: its ``type`` as the code (the exception's
        class name for a cancel, terminate or timeout), its message, and each
        problem of an invalid pipeline as a cause.
    """
    carried = carried_result(error)
    if carried is not None:
        return carried
    failure = _workflow_failure(error)
    code = getattr(failure, "type", None)
    if not isinstance(code, str) or not code:
        code = type(failure).__name__
    # str() of an ApplicationError is "<type>: <message>"; the message alone here
    message = failure.message if isinstance(failure, FailureError) else str(failure)
    problems = [str(p) for p in _problems(failure)]
    status: TerminalStatus = "cancelled" if isinstance(failure, CancelledError) else "failed"
    return PipelineResult(
        status=status,
        error=PipelineError.of_problems(code, message, problems),
    )


def _problems(failure: BaseException) -> list[Any]:
    """The problems an invalid pipeline's failure lists (``details[0].problems``)."""
    details = getattr(failure, "details", None)
    if not details or not isinstance(details[0], dict):
        return []
    problems = details[0].get("problems")
    return list(problems) if isinstance(problems, list) else []
