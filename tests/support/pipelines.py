"""Small pipelines several test modules run."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from aiworker.schemas.outcomes import carried_result, failure_code, failure_message
from aiworker.schemas.pipeline import PipelineResult


async def refused(stack: Any, pipeline: Any) -> tuple[ApplicationError, Any]:
    """Start ``pipeline`` on a test ``Stack``; the failure it ends with, and its handle."""
    h = await stack.start(pipeline)
    with pytest.raises(WorkflowFailureError) as ei:
        await h.result()
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError)
    return cause, h


async def failed_result(handle: Any) -> PipelineResult:
    """The result of a pipeline run that did not succeed, taken from its failure.

    The run must have failed its workflow execution as every such run does: a
    non-retryable ``ApplicationError`` whose ``type`` is the result's error code,
    whose message is the result's one line, and whose details carry the result.
    """
    with pytest.raises(WorkflowFailureError) as ei:
        await handle.result()
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.non_retryable, cause
    result = carried_result(ei.value)
    assert result is not None, f"the failure carries no result: {cause}"
    assert cause.type == failure_code(result), (cause.type, result.error)
    assert cause.message == failure_message(result), cause.message
    return result


async def pipeline_result(handle: Any) -> PipelineResult:
    """The result of a pipeline run however it ended: the completion's
    (``succeeded``, ``partial``) or, checked as :func:`failed_result` does, its failure's.
    Typed or untyped handles alike: the result is a ``PipelineResult``."""
    try:
        completed = await handle.result()
    except WorkflowFailureError:
        return await failed_result(handle)
    # an untyped handle's result is the JSON
    result = PipelineResult.model_validate(completed)
    assert result.status in ("succeeded", "partial"), result.status
    return result


async def pipeline_json(handle: Any) -> dict[str, Any]:
    """:func:`pipeline_result` as JSON (for tests that read an untyped handle's dict)."""
    return (await pipeline_result(handle)).model_dump(mode="json")


def one_step_pipeline(name: str = "traced") -> dict[str, Any]:
    """One validator step over an input document; output ``{"valid": true}``."""
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"doc": {"title": "x"}},
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {
                    "data": "${{ inputs.doc }}",
                    "schema": {"type": "object", "required": ["title"]},
                },
            }
        ],
        "output": {"valid": "${{ steps.check.outputs.valid }}"},
    }


def scrape_pipeline(name: str, url: str, max_attempts: int) -> dict[str, Any]:
    """One web-scrape step of ``url`` (robots not asked), up to ``max_attempts``."""
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"url": url},
        "steps": [
            {
                "id": "get",
                "worker": "web-scrape",
                "input": {
                    "url": "${{ inputs.url }}",
                    "extraction_spec": {"fields": {"h1": "h1"}},
                    "respect_robots": False,
                },
                "retry": {"max_attempts": max_attempts},
            }
        ],
    }


def lost_call_pipeline(name: str, timeout_seconds: float, **step: Any) -> dict[str, Any]:
    """One llm-call step ``ask`` under a 20,000-token budget (the lost-attempt tests);
    ``step`` adds to or replaces the step's fields."""
    ask: dict[str, Any] = {
        "id": "ask",
        "worker": "llm-call",
        "timeout_seconds": timeout_seconds,
        "input": {"prompt": "never answered"},
        **step,
    }
    return {"name": name, "tenant": "acme", "budget": {"max_tokens": 20000}, "steps": [ask]}
