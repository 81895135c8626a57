"""How a pipeline run ends, as Temporal's own tools see it (schemas/outcomes.py).

A run that ends ``succeeded`` or ``partial`` is a completed execution; one that
ends ``failed``, ``budget_exhausted``, ``rejected`` or ``escalation_timed_out`` is
a failed execution whose ``ApplicationError`` carries the error code as its
type and the result in its details; a cancelled run is a cancelled execution.
Read through ``describe()``, ``execute_workflow``, the ``temporal`` CLI's
visibility query and :class:`PipelineClient`, on the session's dev server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest
from conftest import running_stack
from support.pipelines import failed_result
from support.standins import Reply, fail, standin
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.outcomes import carried_result, failure_message, result_from_failure
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.devstack.devserver import temporal_cli_path

STATUS = names.STATUS_KEY
ERROR_CODE = names.ERROR_CODE_KEY


def _products(name: str, on_failure: str = "fail") -> dict[str, Any]:
    """A scrape step ``products`` (a stand-in answers for web-scrape) and a check after it."""
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"url": "https://shop.example/list"},
        "steps": [
            {
                "id": "products",
                "worker": "web-scrape",
                "on_failure": on_failure,
                "input": {
                    "url": "${{ inputs.url }}",
                    "extraction_spec": {"fields": {"title": {"selector": "h1"}}},
                },
            },
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": {"title": "x"}, "schema": {"type": "object"}},
            },
        ],
    }


async def _unavailable(request: dict[str, Any]) -> dict[str, Any]:
    raise fail("fetch_failed", "GET https://shop.example/list: 503 Service Unavailable")


def _cli_list(address: str, query: str) -> list[dict[str, Any]]:
    """``temporal workflow list --query Q`` against ``address``, as JSON rows."""
    out = subprocess.run(
        [
            str(temporal_cli_path()),
            "workflow",
            "list",
            "--address",
            address,
            "--namespace",
            "default",
            "--query",
            query,
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # one JSON document, or one per line (the CLI's "jsonl"-like listing)
    text = out.strip()
    if not text:
        return []
    if text.startswith("["):
        rows: list[dict[str, Any]] = json.loads(text)
        return rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_a_failed_pipeline_is_a_failed_execution_every_temporal_tool_sees(
    client: Client, settings: Settings
) -> None:
    acts = {"web-scrape": standin("web-scrape", _unavailable)}
    wid = f"outcome-failed-{uuid.uuid4().hex[:8]}"
    async with running_stack(client, settings, replace_activities=acts) as stack:
        # the SDK's own call, as a user's script makes it
        with pytest.raises(WorkflowFailureError) as ei:
            await client.execute_workflow(
                names.PIPELINE_WORKFLOW,
                _products("watch"),
                id=wid,
                task_queue=stack.pipelines_queue,
            )
        desc = await client.get_workflow_handle(wid).describe()
        pipelines = PipelineClient(client, settings)
        through_client = await pipelines.result(wid)
        outcome = await pipelines.outcome(wid)
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "fetch_failed" and cause.non_retryable
    # one line: the status, the step and the code, then what the step said
    assert cause.message.startswith("failed: step 'products' fetch_failed: "), cause.message
    assert cause.message.endswith("GET https://shop.example/list: 503 Service Unavailable")
    assert "\n" not in cause.message
    # the details carry the whole result: status, steps, usage, error
    (detail,) = cause.details
    result = PipelineResult.model_validate(detail)
    assert cause.message == failure_message(result)
    assert result.status == "failed"
    assert result.steps["products"].status == "failed"
    assert result.steps["products"].error_code == "fetch_failed"
    assert result.steps["check"].status in ("skipped", "succeeded")
    assert result.error is not None and (result.error.code, result.error.step) == (
        "fetch_failed",
        "products",
    )
    assert result_from_failure(ei.value) == result == carried_result(cause)
    # Temporal's status; aiworker's search attributes as before
    assert desc.status == WorkflowExecutionStatus.FAILED
    assert desc.typed_search_attributes.get(STATUS) == "failed"
    assert desc.typed_search_attributes.get(ERROR_CODE) == "fetch_failed"
    # PipelineClient reads the same result; its JSON is the result's, as before
    assert through_client == result
    assert outcome == {"workflow_id": wid, **result.model_dump(mode="json")}

    # the temporal CLI finds it among the failed executions (visibility is eventual)
    address = client.service_client.config.target_host

    async def listed() -> list[dict[str, Any]]:
        query = f'ExecutionStatus="Failed" AND WorkflowId="{wid}"'
        return await asyncio.to_thread(_cli_list, address, query)

    rows = await wait_until(listed, f"{wid} in the temporal CLI's failed executions")
    assert [r["execution"]["workflowId"] for r in rows] == [wid]
    completed = await asyncio.to_thread(
        _cli_list, address, f'ExecutionStatus="Completed" AND WorkflowId="{wid}"'
    )
    assert completed == []


async def _published(request: dict[str, Any]) -> Reply:
    return Reply(
        {"published": True, "duplicate": False, "idempotency_key": "k", "sink": "hook"},
        usage={"external_calls": 1},
    )


async def test_succeeded_and_partial_complete_and_budget_exhausted_fails_budget_exceeded(
    client: Client, settings: Settings
) -> None:
    hook = {"sink": {"webhook": "http://127.0.0.1:9/x"}, "record": {}}
    over_budget = {
        "name": "budget",
        "budget": {"max_external_calls": 1},
        "steps": [
            {"id": "one", "worker": "publish", "input": hook},
            {"id": "two", "worker": "publish", "input": hook, "depends_on": ["one"]},
        ],
    }
    acts = {
        "web-scrape": standin("web-scrape", _unavailable),
        "publish": standin("publish", _published),
    }
    async with running_stack(client, settings, replace_activities=acts) as stack:
        ok = await stack.start(
            {
                "name": "ok",
                "steps": [
                    {
                        "id": "check",
                        "worker": "validator",
                        "input": {"data": {"title": "x"}, "schema": {"type": "object"}},
                    }
                ],
            }
        )
        partial = await stack.start(_products("tolerant", on_failure="continue"))
        over = await stack.start(over_budget)
        ok_result = await ok.result()
        partial_result = await partial.result()
        over_result = await failed_result(over)
        with pytest.raises(WorkflowFailureError) as ei:
            await over.result()
        states = [(await h.describe()).status for h in (ok, partial, over)]
    assert ok_result.status == "succeeded"
    assert partial_result.status == "partial"
    assert partial_result.error is not None and partial_result.error.code == "fetch_failed"
    assert over_result.status == "budget_exhausted"
    two = over_result.steps["two"]
    assert (two.status, two.error_code) == ("failed", "budget_exceeded")
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "budget_exceeded"
    assert cause.message.startswith("budget_exhausted: step 'two' budget_exceeded: "), cause
    assert states == [
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
    ]


async def test_a_cancelled_pipeline_is_a_cancelled_execution(
    client: Client, settings: Settings
) -> None:
    started = asyncio.Event()

    async def hangs(request: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()  # until the cancellation reaches the activity
        raise AssertionError("unreachable")

    acts = {"web-scrape": standin("web-scrape", hangs)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_products("cancelled"))
        await asyncio.wait_for(started.wait(), 60)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as ei:
            await handle.result()
        desc = await handle.describe()
        result = await PipelineClient(client, settings).result(handle.id)
    assert isinstance(ei.value.cause, CancelledError)
    assert desc.status == WorkflowExecutionStatus.CANCELED
    assert desc.typed_search_attributes.get(STATUS) == "cancelled"
    assert result.status == "cancelled" and result.steps == {}


async def test_an_invalid_pipeline_fails_invalid_input_and_reads_back_with_its_problems(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings) as stack:
        handle = await stack.start({"name": "bad", "steps": [{"id": "a", "worker": "nope"}]})
        with pytest.raises(WorkflowFailureError) as ei:
            await handle.result()
        desc = await handle.describe()
        outcome = await PipelineClient(client, settings).outcome(handle.id)
    assert desc.status == WorkflowExecutionStatus.FAILED
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "invalid_input"
    result = result_from_failure(ei.value)
    assert result.status == "failed" and result.error is not None
    assert result.error.code == "invalid_input"
    assert result.error.cause and "nope" in result.error.cause[0].message
    # the JSON aiworker run and the front door print, as before
    assert outcome["status"] == "failed" and outcome["error_code"] == "invalid_input"
    assert any("nope" in p for p in outcome["problems"])
