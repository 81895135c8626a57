"""Small pipelines several test modules run."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError


async def refused(stack: Any, pipeline: Any) -> tuple[ApplicationError, Any]:
    """Start ``pipeline`` on a test ``Stack``; the failure it ends with, and its handle."""
    h = await stack.start(pipeline)
    with pytest.raises(WorkflowFailureError) as ei:
        await h.result()
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError)
    return cause, h


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
