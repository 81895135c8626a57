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
