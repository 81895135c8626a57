"""The public pipeline client against the session's real Temporal server."""

from __future__ import annotations

import uuid
from typing import Any, assert_type

import pytest
from conftest import Stack
from temporalio.client import WorkflowHandle

import aiworker
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import PipelineClient, RedriveError
from aiworker.workers.devstack.devserver import free_port
from aiworker.workflows.pipeline import PipelineWorkflow


def _pipeline(name: str, data: Any = None) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"doc": data if data is not None else {"title": "t"}},
        "steps": [
            {
                "id": "check",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.doc }}", "schema": {"required": ["title"]}},
            }
        ],
        "output": {"valid": "${{ steps.check.outputs.valid }}"},
    }


async def test_start_returns_a_typed_handle_and_a_pipeline_result(stack: Stack) -> None:
    pipelines = aiworker.PipelineClient(stack.client, stack.settings)
    handle = await pipelines.start(_pipeline("client-ok"))
    assert_type(handle, WorkflowHandle[PipelineWorkflow, PipelineResult])
    result = await handle.result()
    assert isinstance(result, PipelineResult)
    assert result.status == "succeeded"
    assert result.output == {"valid": True}
    assert handle.id.startswith("client-ok-")
    again = await pipelines.result(handle.id)
    assert again == result
    progress = await pipelines.progress(handle.id)
    assert progress["steps"]["check"]["status"] == "succeeded"
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(names.TENANT_KEY) == "acme"
    assert desc.typed_search_attributes.get(names.PIPELINE_KEY) == "client-ok"


async def test_an_invalid_pipeline_raises_and_starts_nothing(stack: Stack) -> None:
    name = f"client-bad-{uuid.uuid4().hex[:6]}"
    bad = {"name": name, "steps": [{"id": "a", "worker": "nope"}]}
    with pytest.raises(aiworker.PipelineSpecError) as e:
        await PipelineClient(stack.client, stack.settings).start(bad)
    (problem,) = e.value.problems
    assert problem.startswith("step 'a': field 'worker': unknown worker 'nope'")
    count = await stack.client.count_workflows(f"{names.SA_PIPELINE} = '{name}'")
    assert count.count == 0


async def test_known_workers_decide_what_the_client_accepts(stack: Stack) -> None:
    only_publish = PipelineClient(stack.client, stack.settings, known_workers=[names.PUBLISH])
    with pytest.raises(aiworker.PipelineSpecError):
        only_publish.check(_pipeline("client-known"))


async def test_outcome_of_a_workflow_that_failed_names_code_and_problems(stack: Stack) -> None:
    pipelines = PipelineClient(stack.client, stack.settings)
    bad = {"name": "client-failed", "steps": [{"id": "a", "worker": "nope"}]}
    handle = await pipelines.start(bad, check=False)  # the workflow checks it, and fails
    doc = await pipelines.outcome(handle.id)
    assert doc["workflow_id"] == handle.id
    assert doc["status"] == "failed" and doc["error_code"] == "invalid_input"
    (problem,) = doc["problems"]
    assert problem.startswith("step 'a': field 'worker': unknown worker 'nope'")
    ok = await pipelines.start(_pipeline("client-outcome"))
    assert (await pipelines.outcome(ok.id))["output"] == {"valid": True}


async def test_redrive_refuses_a_pipeline_that_succeeded(stack: Stack) -> None:
    pipelines = PipelineClient(stack.client, stack.settings)
    handle = await pipelines.start(_pipeline("client-redrive"))
    await handle.result()
    with pytest.raises(RedriveError, match="succeeded; nothing to redrive"):
        await pipelines.redrive(handle.id)


async def test_connect_to_nothing_raises_temporal_unreachable() -> None:
    with pytest.raises(aiworker.TemporalUnreachableError, match="Failed client connect"):
        await PipelineClient.connect(target_host=f"127.0.0.1:{free_port()}")
