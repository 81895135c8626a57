"""A for_each keeps its items' bytes out of every history, on a real Temporal server.

Chunk inputs and results travel through the external payload storage (the
history holds references), a for_each with more leaf chunks than one
workflow's children runs as a tree of chunk workflows, and what the items
produced still reaches ``${{ steps.<id>.outputs.items }}``, the pipeline's
output, the counts and redrive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import running_stack
from support.history import patch_ids
from support.payloads import client_for, history_bytes, stack_settings, workflow_tree
from support.standins import fail, standin
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from aiworker.workers.client.client import PipelineClient
from aiworker.workflows.chunks import FANOUT

# Failed items listed in a for_each step's outputs (workflows/fanout.py MAX_ITEM_ERRORS).
ERRORS_KEPT = 20


def _pipeline(n: int, chunk_size: int, **step: Any) -> dict[str, Any]:
    return {
        "name": "fe-history",
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "chunk_size": chunk_size,
                "max_parallel": chunk_size,
                # every 50th item (0, 50, ...) fails the gate: validation_failed
                "input": {
                    "data": "${{ item }}",
                    "schema": {"type": "integer", "not": {"multipleOf": 50}},
                    "gate": True,
                },
                **step,
            },
            {
                "id": "after",
                "worker": "validator",
                "depends_on": ["each"],
                "input": {
                    "data": "${{ steps.each.outputs.items }}",
                    "schema": {"type": "array", "minItems": n, "maxItems": n},
                    "gate": True,
                },
            },
        ],
        "output": {
            "items": "${{ steps.each.outputs.items }}",
            "failed": "${{ steps.each.outputs.failed }}",
            "after": "${{ steps.after.outputs.valid }}",
        },
    }


def _payloads(event: Any) -> list[Payload]:
    """The payloads a child-workflow event carries (its input or its result)."""
    if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
        return list(event.start_child_workflow_execution_initiated_event_attributes.input.payloads)
    if event.HasField("child_workflow_execution_completed_event_attributes"):
        return list(event.child_workflow_execution_completed_event_attributes.result.payloads)
    return []


def _children(history: Any) -> int:
    return sum(
        e.HasField("start_child_workflow_execution_initiated_event_attributes")
        for e in history.events
    )


def _expected(n: int) -> list[Any]:
    return [None if i % 50 == 0 else {"valid": True, "errors": []} for i in range(n)]


async def _run(client: Client, stack: Any, pipeline: dict[str, Any]) -> tuple[Any, Any]:
    handle: WorkflowHandle[Any, Any] = await stack.start(pipeline)
    return handle, await handle.result()


async def test_parent_history_does_not_grow_with_the_items(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Pipeline inputs and results go out of band too (a low threshold), so the
    # whole parent history compares: ten chunks of 60 items against ten of 300.
    settings = stack_settings(tmp_path, payload_threshold_bytes=8 * 1024)
    client = client_for(env, settings)
    async with running_stack(client, settings) as stack:
        small_handle, small = await _run(client, stack, _pipeline(600, 60))
        big_handle, big = await _run(client, stack, _pipeline(3000, 300))
    small_history = await small_handle.fetch_history()
    big_history = await big_handle.fetch_history()

    assert small.output["items"] == _expected(600)
    assert big.output["items"] == _expected(3000)
    assert big.output["after"] is True
    # every failure counted; the errors listed up to the cap, with their code
    each = big.steps["each"]
    assert big.status == "partial"
    assert each.status == "partial"
    assert big.output["failed"] == each.outputs["failed"] == 60
    assert each.items == {"total": 3000, "succeeded": 2940, "failed": 60}
    assert len(each.outputs["errors"]) == ERRORS_KEPT
    assert {e["error_code"] for e in each.outputs["errors"]} == {"validation_failed"}
    assert each.error_code == "validation_failed"
    assert each.error_message.startswith("60 of 3000 items failed")

    # 2,400 more items (about 100 KB of inputs and results inline before) and
    # the same history: every chunk's input and result is a reference.
    for history in (small_history, big_history):
        assert _children(history) == 10
        carried = [p for e in history.events for p in _payloads(e)]
        assert len(carried) == 20
        assert all(len(p.external_payloads) == 1 for p in carried)
        assert all(p.ByteSize() < 1024 for p in carried)
    assert history_bytes(big_history) < history_bytes(small_history) + 4096


async def test_a_for_each_over_many_chunks_runs_as_a_tree_and_redrives(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # 400 items in chunks of 10: 40 leaf chunks, more than one workflow's
    # FANOUT children, so the pipeline starts groups of leaf chunks. The
    # first run fails every 40th item; the redrive runs only those again.
    settings = stack_settings(tmp_path)
    store_client = client_for(env, settings)
    broken = {"on": True}

    async def echo(req: dict[str, Any]) -> dict[str, Any]:
        n = req["input"]["data"]
        if broken["on"] and n % 40 == 0:
            raise fail("validation_failed", f"item {n} is broken this time")
        return {"n": n}

    pipeline = {
        "name": "fe-tree",
        "inputs": {"items": list(range(400))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "chunk_size": 10,
                "max_parallel": 40,
                "input": {"data": "${{ item }}", "schema": {}},
            }
        ],
        "output": {"items": "${{ steps.each.outputs.items }}"},
    }
    acts = {"validator": standin("validator", echo)}
    async with running_stack(store_client, settings, replace_activities=acts) as stack:
        first, partial = await _run(store_client, stack, pipeline)
        broken["on"] = False
        handle = await PipelineClient(store_client, settings).redrive(first.id)
        result = await handle.result()
        workflows = await workflow_tree(store_client, first.id)

    assert partial.status == "partial"
    assert partial.steps["each"].items == {"total": 400, "succeeded": 390, "failed": 10}
    assert partial.output["items"] == [None if i % 40 == 0 else {"n": i} for i in range(400)]
    assert result.status == "succeeded"
    assert result.output["items"] == [{"n": i} for i in range(400)]
    assert result.redrive["items_rerun"] == {"each": list(range(0, 400, 40))}
    assert result.steps["each"].items == {
        "total": 400,
        "succeeded": 400,
        "failed": 0,
        "reused": 390,
    }

    parent = workflows[first.id]
    assert _children(parent) <= FANOUT
    assert patch_ids(list(parent.events)) == set()  # pinned: one way to run, no patch
    # groups under the pipeline, leaf chunks of at most 10 items under them
    assert len(workflows) == 1 + 20 + 40
    for wid, history in workflows.items():
        assert _children(history) <= FANOUT
        for e in history.events:
            for p in _payloads(e):
                assert len(p.external_payloads) == 1, wid
