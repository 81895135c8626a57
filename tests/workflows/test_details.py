"""The pipeline's current details: the Markdown list of step statuses the Temporal
UI shows, read back through the same built-in query the UI sends, during and
after a run; and the table's bounds."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

from conftest import running_stack
from support.standins import standin
from support.waiting import wait_until
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workflows.details import MAX_CHARS, MAX_ROWS, render_table

# The query the Temporal UI sends for a workflow's current details (and its handlers).
METADATA_QUERY = "__temporal_workflow_metadata"


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """The workflow's current details, as the UI reads them."""
    meta = await handle.query(METADATA_QUERY, result_type=WorkflowMetadata)
    return meta.current_details


def _rows(details: str) -> dict[str, list[str]]:
    """step id -> its fields (worker, status, attempts, items) of the details list."""
    out = {}
    for line in details.splitlines():
        if line.startswith("- **"):
            step, *fields = line[2:].split(" · ")
            out[step.strip("*")] = fields
    return out


async def test_details_show_each_step_while_it_runs_and_after(
    client: Client, settings: Settings
) -> None:
    gate = asyncio.Event()

    async def blocked(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(gate.wait(), 30)
        return {"published": True}

    pipeline = {
        "name": "details",
        "inputs": {"items": [{"a": 1}, {"a": 2}, {"a": 3}]},
        "steps": [
            {"id": "fast", "worker": "validator", "input": {"data": 1, "schema": {}}},
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "input": {"data": "${{ item }}", "schema": {"type": "object"}},
            },
            {
                "id": "slow",
                "worker": "publish",
                "depends_on": ["fast"],
                "input": {"sink": {"file": "x"}, "record": {}},
            },
        ],
    }
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", blocked)}
    ) as stack:
        handle = await stack.start(pipeline)

        async def slow_running() -> bool:
            p = await handle.query(names.PROGRESS_QUERY)
            return bool(
                p["steps"]["slow"]["status"] == "running"
                and p["steps"]["each"]["status"] == "succeeded"
            )

        await wait_until(slow_running, "the slow step to run")
        during = await current_details(handle)
        gate.set()
        result = await handle.result()
        after = await current_details(handle)  # replayed from history by the worker
        desc = await handle.describe()
        shown = await asyncio.to_thread(
            subprocess.run,
            [
                temporal_cli_path(),
                "workflow",
                "metadata",
                "--address",
                client.service_client.config.target_host,
                "--namespace",
                client.namespace,
                "--workflow-id",
                handle.id,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.status == "succeeded"
    assert during.splitlines()[0] == "**details** · running · 2 of 3 steps done"
    assert _rows(during) == {
        "fast": ["validator", "succeeded", "1 attempt"],
        "each": ["validator", "succeeded", "1 attempt", "items 3 of 3"],
        "slow": ["publish", "running", "1 attempt"],
    }
    assert after.splitlines()[0] == "**details** · succeeded · 3 of 3 steps done"
    assert _rows(after)["slow"] == ["publish", "succeeded", "1 attempt"]
    # the `temporal` CLI shows them as the UI does
    assert shown.returncode == 0, shown.stderr
    assert "**details** · succeeded · 3 of 3 steps done" in shown.stdout, shown.stdout
    # current details are no part of the workflow's static user metadata
    assert not desc.raw_description.execution_config.user_metadata.details.data


def test_table_is_bounded_and_counts_the_rest() -> None:
    n = MAX_ROWS + 30
    workers = {f"s{i}": "validator" for i in range(n)}
    rows: dict[str, Any] = {f"s{i}": ("succeeded", 1, False, None, None) for i in range(40)}
    text = render_table("big", "running", workers, rows)
    assert len(_rows(text)) == MAX_ROWS
    assert text.splitlines()[0] == f"**big** · running · 40 of {n} steps done"
    assert text.splitlines()[-1] == ("… 30 more steps (pending 30): the `progress` query has all")
    # Markdown in an id is escaped (shown as written); the whole stays under its cap
    long = render_table("x", "running", {"a_b": "w*x"}, {"a_b": ("running", 2, True, 4, 10)})
    assert (
        "- **a\\_b** · w\\*x · running (cached) · 2 attempts · items 4 of 10" in long.splitlines()
    )
    assert len(render_table("y" * 100, "running", workers, {})) < MAX_CHARS
