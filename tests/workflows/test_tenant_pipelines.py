"""Tenants in pipelines, on a real Temporal server: with a registry, a tenant
is what the operator configured, not what a spec claims."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support import history
from support.payloads import stack_settings
from support.pipelines import pipeline_result, refused
from support.standins import standin
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.config.settings import parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.tenants import TenantRegistry
from aiworker.workers.cli.parser import build_parser
from aiworker.workers.client.client import PipelineClient, RedriveError
from aiworker.workflows.pipeline import PipelineWorkflow

REGISTRY = TenantRegistry.model_validate(
    {
        "tenants": {
            "acme": {"workers": ["validator", "aggregator"], "concurrency": 1},
            "globex": {
                "rate_limits": {"validator": "5/min"},
                "budget": {"max_tokens": 10, "max_external_calls": 0},
            },
            "initech": {"rate_limits": {"validator": "1000/min"}},
        }
    }
)
V = {"data": {"a": 1}, "schema": {"type": "object"}}


def _pipeline(tenant: str, *steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    default = ({"id": "check", "worker": "validator", "input": V},)
    return {"name": "tenanted", "tenant": tenant, "steps": list(steps or default), **extra}


@pytest_asyncio.fixture
async def tenanted(client: Client, tmp_path: Path) -> AsyncIterator[Stack]:
    """A stack whose processes read a tenant registry."""
    rules = tuple(parse_rate_limits("validator:*=100/min"))
    settings = stack_settings(tmp_path, tenants=REGISTRY, rate_limits=rules)
    async with running_stack(client, settings) as stack:
        yield stack


async def _limiter_answers(stack: Stack, handle: Any) -> list[Any]:
    """The answers of every limiter-acquire local activity the pipeline ran (from
    the history's markers: a local activity's input is not recorded)."""
    out = []
    for e in await history.events(handle):
        if e.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        details = e.marker_recorded_event_attributes.details
        if not details["data"].payloads:
            continue  # a patch marker (workflow.patched), not a local activity
        data = json.loads(details["data"].payloads[0].data)
        if data.get("activity_type") == "limiter-acquire":
            out.append((await stack.client.data_converter.decode(details["result"].payloads))[0])
    return out


async def test_an_unknown_tenant_is_refused_before_any_step(tenanted: Stack) -> None:
    err, handle = await refused(tenanted, _pipeline("initech-eu"))
    assert err.type == "invalid_input" and err.non_retryable
    assert "tenant 'initech-eu' is not configured" in str(err)
    assert await history.scheduled_activities(handle) == []
    assert await history.workflow_task_failures(handle) == 0


@pytest.mark.parametrize("tenant", ["Acme", "acme/../globex", "a" * 64, ""])
async def test_a_bad_tenant_name_isrefused(stack: Stack, tenant: str) -> None:
    err, handle = await refused(stack, _pipeline(tenant))
    assert err.type == "invalid_input" and "tenant" in str(err)
    assert await history.scheduled_activities(handle) == []


@pytest.mark.parametrize(
    "argv", [["list", "--tenant", "Acme"], ["conformance", "x", "--tenant", "a/b"]]
)
def test_a_bad_tenant_name_on_the_command_line_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert "is not a tenant name" in capsys.readouterr().err


async def test_a_worker_the_tenant_may_not_call_is_refused_before_any_step(
    tenanted: Stack,
) -> None:
    pipeline = _pipeline(
        "acme",
        {"id": "check", "worker": "validator", "input": V},
        {
            "id": "out",
            "worker": "publish",
            "depends_on": ["check"],
            "input": {"sink": {"file": "x.jsonl"}, "record": 1},
        },
    )
    err, handle = await refused(tenanted, pipeline)
    assert err.type == "invalid_input"
    assert "step 'out': field 'worker': tenant 'acme' may not call worker 'publish'" in str(err)
    assert await history.scheduled_activities(handle) == []
    assert not (tenanted.settings.data_dir / "sinks").exists()


async def test_the_registry_budget_ceiling_tightens_the_spec_budget(tenanted: Stack) -> None:
    pipeline = _pipeline(
        "globex",
        {"id": "out", "worker": "publish", "input": {"sink": {"file": "x.jsonl"}, "record": 1}},
        budget={"max_tokens": 1000, "max_external_calls": 50, "deadline_seconds": 600},
    )
    handle = await tenanted.start(pipeline)
    result: PipelineResult = await pipeline_result(handle)
    progress = await handle.query(PipelineWorkflow.progress)
    assert result.status == "budget_exhausted"
    assert result.steps["out"].error_code == "budget_exceeded"
    # tokens and calls from the registry, the deadline from the spec: each the tighter
    assert progress["budget"]["limits"] == {
        "max_tokens": 10,
        "max_external_calls": 0,
        "deadline_seconds": 600.0,
        "max_cost_usd": None,
    }
    assert "publish" not in await history.scheduled_activities(handle)


async def test_a_registry_rate_ceiling_and_the_rate_rules_the_tighter_wins(
    tenanted: Stack,
) -> None:
    # globex: registry 5/min, rule 100/min; initech: registry 1000/min, rule 100/min
    limits = {}
    for tenant in ("globex", "initech"):
        handle = await tenanted.start(_pipeline(tenant))
        assert (await handle.result()).status == "succeeded"
        [answer] = await _limiter_answers(tenanted, handle)
        limits[tenant] = (answer["key"], answer["limit"], answer["period_seconds"])
    assert limits == {
        "globex": ("rate:validator:globex", 5, 60.0),
        "initech": ("rate:validator:initech", 100, 60.0),
    }


async def test_the_tenant_concurrency_ceiling_holds_across_pipelines(
    client: Client, tmp_path: Path
) -> None:
    release, started = asyncio.Event(), asyncio.Event()

    async def held(request: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"policy": "all", "result": {}, "used": [], "failed": []}

    settings = stack_settings(tmp_path, tenants=REGISTRY)
    step = {"id": "agg", "worker": "aggregator", "input": {"policy": "all", "branches": {}}}
    acts = {"aggregator": standin("aggregator", held)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        first = await stack.start(_pipeline("acme", step))
        # the step runs (a local activity: no event in the history until it ends)
        await asyncio.wait_for(started.wait(), 10)
        second = await stack.start(_pipeline("acme", step, budget={"deadline_seconds": 2}))
        waited: PipelineResult = await pipeline_result(second)
        release.set()
        done: PipelineResult = await first.result()
        [answer] = await _limiter_answers(stack, first)
    assert done.status == "succeeded"
    assert waited.status == "failed" and waited.error is not None
    assert "while waiting for a concurrency slot (tenant acme)" in waited.error.message
    assert await history.called_workers(second) == []
    assert (answer["key"], answer["limit"]) == ("tenant:acme", 1)


async def test_resume_from_may_only_name_a_run_of_the_same_tenant(tenanted: Stack) -> None:
    earlier = await tenanted.start(_pipeline("initech"))
    assert (await earlier.result()).status == "succeeded"
    resume = {"workflow_id": earlier.id, "steps": {}}
    err, handle = await refused(tenanted, _pipeline("globex", resume_from=resume))
    assert err.type == "invalid_input" and "not a pipeline run of tenant" in str(err)
    assert await history.scheduled_activities(handle) == []
    # a run that cannot be found: the same words (another tenant's ids are not told)
    ghost = {"workflow_id": f"ghost-{uuid.uuid4().hex}", "steps": {}}
    missing, _ = await refused(tenanted, _pipeline("globex", resume_from=ghost))
    assert missing.type == "invalid_input"
    assert str(missing).replace(ghost["workflow_id"], earlier.id) == str(err)
    # the same tenant may
    same = await tenanted.start(_pipeline("initech", resume_from=resume))
    assert (await same.result()).status == "succeeded"
    # and the client, acting for a tenant, reads no other tenant's outputs
    pipelines = PipelineClient(tenanted.client, tenanted.settings)
    with pytest.raises(RedriveError, match="not a pipeline of tenant 'globex'"):
        await pipelines.redrive_input(earlier.id, tenant="globex")
