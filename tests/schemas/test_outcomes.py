"""schemas/outcomes.py without a server: the code and the one-line message a run
that did not succeed fails with, and the result read back from any failure."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError

from aiworker.schemas.causes import PipelineError
from aiworker.schemas.outcomes import (
    MAX_MESSAGE_CHARS,
    carried_result,
    completes,
    failure_code,
    failure_message,
    pipeline_failure,
    result_from_failure,
)
from aiworker.schemas.pipeline import PipelineResult, StepResult


def _ended(status: str, code: str | None = "fetch_failed", message: str = "503") -> PipelineResult:
    error = PipelineError(code=code, message=message, step="products") if code else None
    return PipelineResult.model_validate(
        {
            "status": status,
            "steps": {"products": StepResult(status="failed", error_code=code).model_dump()},
            "error": error.model_dump() if error else None,
        }
    )


@pytest.mark.parametrize(
    ("status", "completed"),
    [
        ("succeeded", True),
        ("partial", True),
        ("failed", False),
        ("rejected", False),
        ("escalation_timed_out", False),
        ("budget_exhausted", False),
        ("cancelled", False),
    ],
)
def test_only_succeeded_and_partial_complete(status: str, completed: bool) -> None:
    assert completes(status) is completed


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        ("failed", "fetch_failed", "fetch_failed"),
        ("rejected", "invalid_output", "invalid_output"),
        ("escalation_timed_out", "validation_failed", "validation_failed"),
        # the budget ends the run whatever step failed first
        ("budget_exhausted", "not_found", "budget_exceeded"),
        # no error named (never expected): the code the status implies
        ("failed", None, "internal"),
        ("rejected", None, "validation_failed"),
        ("escalation_timed_out", None, "timeout"),
    ],
)
def test_the_failure_code(status: str, code: str | None, expected: str) -> None:
    assert failure_code(_ended(status, code)) == expected


def test_the_message_is_one_bounded_line() -> None:
    result = _ended("failed", message="GET /list\nanswered 503\n\tService Unavailable")
    assert failure_message(result) == (
        "failed: step 'products' fetch_failed: GET /list answered 503 Service Unavailable"
    )
    long = failure_message(_ended("failed", message="x" * 2000))
    assert len(long) == MAX_MESSAGE_CHARS and long.endswith("…")


def test_the_failure_carries_the_result_and_reads_back() -> None:
    result = _ended("budget_exhausted")
    failure = pipeline_failure(result)
    assert failure.type == "budget_exceeded" and failure.non_retryable
    assert failure.message == failure_message(result)
    assert failure.details == (result,)
    # what a client decodes: the JSON, compact (empty defaults left out)
    compact = result.model_dump(mode="json", exclude_defaults=True)
    decoded = ApplicationError(failure.message, compact, type=failure.type)
    assert carried_result(decoded) == result_from_failure(decoded) == result


def test_an_invalid_pipeline_reads_back_with_its_problems() -> None:
    problems = ["step 'a': field 'worker': unknown worker 'nope'"]
    failure = ApplicationError(
        "invalid pipeline", {"code": "invalid_input", "problems": problems}, type="invalid_input"
    )
    assert carried_result(failure) is None
    result = result_from_failure(failure)
    assert result.status == "failed" and result.steps == {}
    assert result.error is not None
    assert (result.error.code, result.error.message) == ("invalid_input", "invalid pipeline")
    assert [c.message for c in result.error.cause] == problems


def test_a_cancel_and_a_terminate_read_back_as_what_ended_them() -> None:
    cancelled = result_from_failure(CancelledError("cancelled by ann"))
    assert cancelled.status == "cancelled" and cancelled.error is not None
    assert cancelled.error.code == "CancelledError"
    terminated = result_from_failure(TerminatedError("test over"))
    assert terminated.status == "failed" and terminated.error is not None
    assert (terminated.error.code, terminated.error.message) == ("TerminatedError", "test over")
