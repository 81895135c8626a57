"""Small pipelines several test modules run."""

from __future__ import annotations

from typing import Any


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
