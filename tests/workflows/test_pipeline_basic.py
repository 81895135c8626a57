from __future__ import annotations

from conftest import Stack


async def test_validator_pipeline_runs_end_to_end(stack: Stack) -> None:
    pipeline = {
        "name": "basic",
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
    handle = await stack.start(pipeline)
    result = await handle.result()
    assert result.status == "succeeded"
    assert result.output == {"valid": True}
    assert result.steps["check"].attempts == 1
