from __future__ import annotations

from conftest import Stack
from support.pipelines import one_step_pipeline


async def test_validator_pipeline_runs_end_to_end(stack: Stack) -> None:
    pipeline = one_step_pipeline("basic")
    handle = await stack.start(pipeline)
    result = await handle.result()
    assert result.status == "succeeded"
    assert result.output == {"valid": True}
    assert result.steps["check"].attempts == 1
