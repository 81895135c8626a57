"""Priority and fairness on the session's real Temporal server (the dev server
with the priority matcher and fairness on): a pipeline's ``priority`` orders a
backlogged queue, reaches every activity and for_each chunk it starts, and its
tenant is the fairness key with the registry's weight."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support import history
from support.payloads import stack_settings
from support.pipelines import refused
from support.procs import run_cli_module
from temporalio.api.common.v1 import Priority as PriorityProto
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from aiworker.schemas import names
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.schemas.tenants import TenantRegistry
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import local_server_extra_args, temporal_cli_path

REGISTRY = TenantRegistry.model_validate(
    {"tenants": {"acme": {"fairness_weight": 3}, "globex": {}}}
)
V = {"data": {"a": 1}, "schema": {"type": "object"}}


def _pipeline(name: str, priority: int | None = None, **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "name": name,
        "steps": [{"id": "check", "worker": "validator", "input": V}],
        **extra,
    }
    if priority is not None:
        p["priority"] = priority
    return p


def _fan_out(priority: int | None) -> dict[str, Any]:
    """A step, then a for_each of 3 items in chunks of 2: two child workflows."""
    return _pipeline(
        "prio-fan",
        priority,
        tenant="acme",
        steps=[
            {"id": "check", "worker": "validator", "input": V},
            {
                "id": "each",
                "worker": "validator",
                "depends_on": ["check"],
                "for_each": [1, 2, 3],
                "chunk_size": 2,
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            },
        ],
    )


def _triple(p: PriorityProto) -> tuple[int, str, float]:
    return (p.priority_key, p.fairness_key, round(p.fairness_weight, 3))


async def _priorities(client: Client, workflow_id: str) -> dict[str, list[tuple[int, str, float]]]:
    """The priority on the run's start event, each activity scheduled and each child
    started, as ``(priority_key, fairness_key, fairness_weight)``."""
    out: dict[str, list[tuple[int, str, float]]] = {"started": [], "activities": [], "children": []}
    for e in await history.events(client.get_workflow_handle(workflow_id)):
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            out["started"].append(_triple(e.workflow_execution_started_event_attributes.priority))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out["activities"].append(_triple(e.activity_task_scheduled_event_attributes.priority))
        elif e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            attrs = e.start_child_workflow_execution_initiated_event_attributes
            out["children"].append(_triple(attrs.priority))
    return out


@pytest_asyncio.fixture(scope="module")
async def one_partition() -> AsyncIterator[Client]:
    """A dev server of its own whose task queues have one partition each: Temporal
    orders each partition's backlog by priority, and with the default four a
    poll may take a partition's low task while the urgent one sits in another."""
    one = ["matching.numTaskqueueReadPartitions=1", "matching.numTaskqueueWritePartitions=1"]
    env = await WorkflowEnvironment.start_local(
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=[
            *local_server_extra_args(),
            *(a for kv in one for a in ("--dynamic-config-value", kv)),
        ],
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


def test_the_test_server_runs_with_priority_and_fairness_on() -> None:
    args = local_server_extra_args()
    pairs = {args[i + 1] for i, a in enumerate(args) if a == "--dynamic-config-value"}
    assert {"matching.useNewMatcher=true", "matching.enableFairness=true"} <= pairs


async def test_a_high_priority_pipeline_overtakes_a_queued_backlog(
    one_partition: Client, tmp_path: Path
) -> None:
    client = one_partition
    # One workflow task and one activity at a time: the queue decides the order.
    settings = stack_settings(
        tmp_path, max_concurrent_activities=1, max_concurrent_workflow_tasks=1, pollers=2
    )
    pipelines = PipelineClient(client, settings)
    backlog = 16
    low = [await pipelines.start(_pipeline("backlog", 5)) for _ in range(backlog)]
    # Both started behind the whole backlog, while no worker polls the queue: one
    # at the backlog's priority (the control), one at the highest.
    late = await pipelines.start(_pipeline("late", 5))
    urgent = await pipelines.start(_pipeline("urgent", 1))
    every = [*low, late, urgent]
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in every)), 120)
    assert {r.status for r in results} == {"succeeded"}
    closed = [(await h.describe()).close_time for h in every]
    assert None not in closed
    backlog_closed = closed[:backlog]

    def finished_before(i: int) -> int:
        return sum(1 for c in backlog_closed if c < closed[i])  # type: ignore[operator]

    # Order, not time: how many of the backlog ended before each of the two.
    assert finished_before(-1) <= 1, f"{finished_before(-1)} of {backlog} ended first"
    assert finished_before(-2) >= backlog * 3 // 4, "the control overtook the backlog too"


# A priority rides on activity commands; the validator's calls run as local activities
# (no task queue, no priority) unless the setting turns them off, as these tests do.
NO_LOCAL = {"local_activities": False}


@pytest.mark.parametrize("started_by", ["aiworker", "temporal"])
async def test_every_activity_and_chunk_carries_the_spec_priority_and_the_tenant_fairness(
    client: Client, tmp_path: Path, started_by: str
) -> None:
    settings = stack_settings(tmp_path, tenants=REGISTRY, **NO_LOCAL)
    async with running_stack(client, settings) as stack:
        if started_by == "aiworker":
            handle: Any = await PipelineClient(client, settings).start(_fan_out(2))
        else:  # as `temporal workflow start` does it: no priority on the start
            handle = await stack.start(_fan_out(2))
        result = await handle.result()
    assert result.status == "succeeded", result.error
    wanted = (2, "acme", 3.0)
    parent = await _priorities(client, handle.id)
    assert parent["started"] == [wanted if started_by == "aiworker" else (0, "", 0.0)]
    assert parent["activities"] == [wanted]
    assert parent["children"] == [wanted, wanted]
    for k in range(2):
        chunk = await _priorities(client, f"{handle.id}/each/{k}")
        assert chunk["started"] == [wanted]
        assert chunk["activities"] == [wanted] * (2 if k == 0 else 1)


async def test_without_priority_the_tenant_is_the_fairness_key_and_commands_are_unchanged(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, tenants=REGISTRY, **NO_LOCAL)
    async with running_stack(client, settings):
        pipelines = PipelineClient(client, settings)
        acme = await pipelines.start(_fan_out(None))
        globex = await pipelines.start(_pipeline("plain", tenant="globex"))
        assert (await acme.result()).status == "succeeded"
        assert (await globex.result()).status == "succeeded"
    seen = await _priorities(client, acme.id)
    # The start carries the tenant and its registry weight; the server passes them
    # on at dispatch, so no activity or child command carries a priority.
    assert seen["started"] == [(0, "acme", 3.0)]
    assert seen["activities"] == [(0, "", 0.0)]
    assert seen["children"] == [(0, "", 0.0), (0, "", 0.0)]
    chunk = await _priorities(client, f"{acme.id}/each/0")
    assert chunk["started"] == [(0, "acme", 3.0)]
    assert chunk["activities"] == [(0, "", 0.0)] * 2
    # A tenant without a weight of its own has the registry's default.
    assert (await _priorities(client, globex.id))["started"] == [(0, "globex", 1.0)]


async def test_aiworker_run_starts_a_pipeline_with_its_priority_and_the_tenant_weight(
    client: Client, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(REGISTRY.model_dump_json())
    settings = stack_settings(tmp_path, tenants=REGISTRY, **NO_LOCAL)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_pipeline("cli-prio", 1, tenant="acme")))
    workflow_id = f"cli-prio-{uuid.uuid4().hex[:8]}"
    env = _clean_env() | {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "AIWORKER_TASK_QUEUE_SUFFIX": settings.task_queue_suffix,
        "AIWORKER_TENANTS_FILE": str(tenants),
    }
    async with running_stack(client, settings):
        proc = await asyncio.to_thread(
            run_cli_module, ["run", str(f), "--id", workflow_id, "--json"], env
        )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "succeeded"
    seen = await _priorities(client, workflow_id)
    assert seen["started"] == [(1, "acme", 3.0)]
    assert seen["activities"] == [(1, "acme", 3.0)]


@pytest.mark.parametrize("priority", [0, 6, "1", True, 2.0])
async def test_a_priority_out_of_range_is_refused_at_start(stack: Stack, priority: Any) -> None:
    pipeline = _pipeline("bad-prio", 1) | {"priority": priority}
    # Started without a check (temporal workflow start): the workflow refuses it.
    err, handle = await refused(stack, pipeline)
    assert err.type == "invalid_input" and err.non_retryable
    assert "field 'priority'" in str(err)
    assert await history.scheduled_activities(handle) == []
    assert await history.workflow_task_failures(handle) == 0
    # Checked by the client: nothing starts.
    with pytest.raises(PipelineSpecError) as ei:
        await PipelineClient(stack.client, stack.settings).start(
            pipeline, workflow_id=f"never-{uuid.uuid4().hex[:8]}"
        )
    assert "field 'priority'" in str(ei.value)


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (9, "field 'priority': must be less than or equal to 5, got 9"),
        (0, "field 'priority': must be greater than or equal to 1, got 0"),
        ("1", "field 'priority': must be an integer, not string \"1\""),
    ],
)
async def test_aiworker_check_refuses_a_priority_out_of_range(
    tmp_path: Path, priority: Any, message: str
) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_pipeline("bad-prio", 1) | {"priority": priority}))
    proc = await asyncio.to_thread(run_cli_module, ["check", str(f), "--json"], _clean_env())
    assert proc.returncode == 2, proc.stderr
    [problem] = json.loads(proc.stdout)
    assert (problem["field"], problem["path"]) == ("priority", "priority")
    assert message in problem["message"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
