"""An ``llm-agent`` step under its tenant's limits, on a real Temporal server.

Each model turn and tool call of the agent is held to what a step calling that
worker is held to (issue #31, item 2): the tenant's rate limit (the call waits
for its permit, as a step's does, and the agent ends ``rate_limited`` when its
deadline passes first) and the tenant's worker list (``llm-call`` and every
tool, also a tool named by an earlier step's outputs). The model is the
scripted loopback model (``fixtures/agent_model.py``), the tools the real
built-in workers, the limiter the real ``LimiterWorkflow``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.agent_model import (  # noqa: F401  (module fixture)
    ScriptedModel,
    call,
    models_file,
    say,
    scripted_model,
)
from prometheus_client import CollectorRegistry
from support import history
from support.front_door import bearer, running_door, write_config
from support.payloads import stack_settings
from support.pipelines import pipeline_result, refused
from support.procs import worker_env
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.tenants import TenantRegistry
from aiworker.workers.process.resources import build_language_model, build_tools

CHECK = {"data": {"n": 1}, "schema": {"type": "object"}}
REGISTRY = {
    # the tenant: one validator call and one model call a minute
    "slow": {"rate_limits": {"validator": "1/min", "llm-call": "1/min"}},
    # may use the agent and the validator, nothing else
    "narrow": {"workers": ["llm-agent", "llm-call", "validator"]},
    # may use the agent, but no model
    "nomodel": {"workers": ["llm-agent", "validator"]},
    # may pick its tools with an aggregator, but not publish
    "picker": {"workers": ["llm-agent", "llm-call", "validator", "aggregator"]},
}


@dataclass
class Agents:
    stack: Stack
    model: ScriptedModel
    name: str

    def pipeline(self, tenant: str, tools: Any, **extra: Any) -> dict[str, Any]:
        agent = {
            "id": "agent",
            "worker": names.LLM_AGENT,
            "input": {"prompt": "Check it.", "model": "openai-agent", "tools": tools},
        }
        steps = [*extra.pop("before", []), agent]
        return {"name": "limited-agent", "tenant": tenant, "steps": steps, **extra}


@asynccontextmanager
async def agent_stack(
    client: Client, tmp: Path, model: ScriptedModel, **settings: Any
) -> AsyncIterator[Agents]:
    """The real stack with a tenant registry and the scripted model as ``openai-agent``."""
    name = f"limited-{uuid.uuid4().hex[:8]}"
    registry = TenantRegistry.model_validate({"tenants": REGISTRY})
    path = models_file(model, tmp / "models.json", name)
    s = stack_settings(tmp, tenants=registry, models_file=path, **settings)
    tools = build_tools(s)
    tools["language_model"] = build_language_model(
        s, {}, llm_metrics=LlmMetrics(CollectorRegistry())
    )
    try:
        async with running_stack(client, s, tools=tools) as stack:
            yield Agents(stack, model, name)
    finally:
        await tools["language_model"].aclose()
        await tools["fetch_url"].aclose()


@pytest_asyncio.fixture
async def agents(
    client: Client, tmp_path: Path, scripted_model: ScriptedModel
) -> AsyncIterator[Agents]:
    async with agent_stack(client, tmp_path, scripted_model) as a:
        yield a


async def child_calls(client: Client, workflow_id: str) -> list[tuple[str, float]]:
    """(worker, scheduled at in workflow time) of each call the agent child made."""
    handle = client.get_workflow_handle(f"{workflow_id}/agent")
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            e.event_time.ToDatetime().timestamp(),
        )
        for e in await history.events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


@pytest.mark.timeout(90)
async def test_tool_calls_wait_for_the_tenants_rate_permit_and_end_rate_limited_at_the_deadline(
    agents: Agents,
) -> None:
    """The issue's case: validator 1/min for the tenant. A step's second call would
    wait for the next minute; so does the agent's, and with a deadline 8 s away the
    agent ends ``rate_limited`` after one validator call (before: three in a second)."""
    agents.model.script(
        agents.name,
        call(("validator", CHECK), ("validator", CHECK), ("validator", CHECK)),
        say("All three are valid."),
    )
    pipeline = agents.pipeline("slow", ["validator"], budget={"deadline_seconds": 8})
    handle = await agents.stack.start(pipeline)
    result: PipelineResult = await asyncio.wait_for(pipeline_result(handle), 60)
    step = result.steps["agent"]
    calls = [w for w, _ in await child_calls(agents.stack.client, handle.id)]
    assert calls.count("validator") == 1, calls
    assert calls.count(names.LLM_CALL) == 1, calls
    assert step.status == "failed" and step.error_code == "rate_limited", step
    assert "turn 1 validator (validator) waited for the tenant's rate limit" in (
        step.error_message or ""
    )
    assert step.outputs is not None and step.outputs["stopped"] == "rate_limited"
    assert step.reasons[0]["worker"] == "validator"
    child = agents.stack.client.get_workflow_handle(f"{handle.id}/agent")
    assert history.patch_ids(await history.events(child)) == set()  # pinned: no patch
    assert await history.workflow_task_failures(child) == 0


@pytest.mark.timeout(120)
async def test_turns_and_tool_calls_keep_to_one_a_minute_as_time_passes(
    ts_env: WorkflowEnvironment, tmp_path: Path, scripted_model: ScriptedModel
) -> None:
    """Time-skipping: validator 1/min and llm-call 1/min for the tenant, an agent that
    makes three validator calls over two turns and no deadline. Every call runs,
    and no two calls of one worker fall in the same minute."""
    async with agent_stack(ts_env.client, tmp_path, scripted_model) as agents:
        agents.model.script(
            agents.name,
            call(("validator", CHECK), ("validator", CHECK)),
            call(("validator", CHECK)),
            say("All valid."),
        )
        pipeline = agents.pipeline("slow", ["validator"])
        handle = await agents.stack.start(pipeline, memo={"search_attributes": False})
        try:
            result: PipelineResult = await asyncio.wait_for(pipeline_result(handle), 90)
            calls = await child_calls(ts_env.client, handle.id)
        finally:
            # an idle limiter on the time-skipping server would stop time for later tests
            suffix = agents.stack.settings.task_queue_suffix
            for worker in ("validator", names.LLM_CALL):
                limiter = ts_env.client.get_workflow_handle(
                    names.limiter_workflow_id(f"rate:{worker}:slow", suffix)
                )
                try:
                    if (await limiter.describe()).status == WorkflowExecutionStatus.RUNNING:
                        await limiter.terminate("test over")
                except Exception:
                    pass
    assert result.status == "succeeded", result.steps["agent"]
    assert result.steps["agent"].outputs["answer"] == "All valid."
    for worker, expected in (("validator", 3), (names.LLM_CALL, 3)):
        times = [t for w, t in calls if w == worker]
        assert len(times) == expected, calls
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= 59.0 for g in gaps), (worker, gaps)


@pytest.mark.timeout(60)
async def test_an_agent_whose_tools_the_tenant_may_not_call_is_refused_before_any_step(
    agents: Agents,
) -> None:
    """Started straight on Temporal (no client-side check): the run's own tenant
    check refuses a tool outside the tenant's list, and llm-call for a tenant that
    may not call a model, as it refuses a step's worker; nothing runs."""
    tools = ["validator", {"worker": "aggregator", "max_calls": 1}]
    err, handle = await refused(agents.stack, agents.pipeline("narrow", tools))
    assert err.type == "invalid_input" and err.non_retryable
    assert err.message == (
        "step 'agent': field 'input.tools[1]': tenant 'narrow' may not call worker 'aggregator'"
    )
    assert await history.scheduled_activities(handle) == []
    assert (
        await history.count(handle, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
        == 0
    )
    assert history.patch_ids(await history.events(handle)) == set()  # pinned: no patch

    err, handle = await refused(agents.stack, agents.pipeline("nomodel", ["validator"]))
    assert err.type == "invalid_input"
    assert err.message == (
        "step 'agent': field 'worker': tenant 'nomodel' may not call worker 'llm-call' "
        "(each model turn of 'llm-agent' is a call of it)"
    )
    assert agents.model.seen(agents.name) == []


@pytest.mark.timeout(60)
async def test_a_tool_named_by_a_steps_outputs_is_refused_when_the_agent_starts(
    agents: Agents,
) -> None:
    """A tool list only the run knows (an earlier step's outputs): the agent holds it
    to the tenant's list before its first turn; the model is never asked."""
    agents.model.script(agents.name, call(("publish", {"record": 1})), say("done"))
    pick = {
        "id": "pick",
        "worker": "aggregator",
        "input": {"policy": "concat", "branches": {"a": ["validator"], "b": ["publish"]}},
    }
    pipeline = agents.pipeline("picker", "${{ steps.pick.outputs.result }}", before=[pick])
    handle = await agents.stack.start(pipeline)
    result: PipelineResult = await asyncio.wait_for(pipeline_result(handle), 45)
    step = result.steps["agent"]
    assert step.status == "failed" and step.error_code == "invalid_input", step
    assert step.error_message == (
        "step 'agent': field 'input.tools[1]': tenant 'picker' may not call worker 'publish'"
    )
    assert step.reasons == [
        {
            "path": "input.tools[1]",
            "message": "tenant 'picker' may not call worker 'publish'",
            "worker": "publish",
        }
    ]
    assert await child_calls(agents.stack.client, handle.id) == []
    assert agents.model.seen(agents.name) == []


@pytest.mark.timeout(90)
async def test_the_front_door_refuses_an_agent_whose_tools_the_tenant_may_not_call(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """``aiworker serve`` as its own process: the key's tenant may not call publish,
    so a pipeline whose agent lists it as a tool is refused with the step's problem
    and starts nothing, as a step naming publish is."""
    registry = {"acme": {"workers": ["llm-agent", "llm-call", "validator"]}, "beta": {}}
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": registry}))
    env = worker_env(client, settings, tmp_path / "data") | write_config(tmp_path)
    env["AIWORKER_TENANTS_FILE"] = str(tmp_path / "tenants.json")
    agent = {
        "id": "agent",
        "worker": "llm-agent",
        "input": {"prompt": "Publish it.", "tools": ["validator", "publish"]},
    }
    name = f"door-agent-{uuid.uuid4().hex[:6]}"
    async with (
        running_door(env, tmp_path / "serve.log") as door,
        httpx.AsyncClient(base_url=door.url, timeout=30) as http,
    ):
        r = await http.post(
            "/v1/pipelines", json={"name": name, "steps": [agent]}, headers=bearer("ci")
        )
    assert r.status_code == 400, r.text
    body = r.json()["error"]
    assert body["code"] == "invalid_input"
    assert (
        "step 'agent': field 'input.tools[1]': tenant 'acme' may not call worker 'publish'"
        in (body["message"])
    )
    assert [p["path"] for p in body["problems"]] == ["steps[0].input.tools[1]"]
    started = [
        w async for w in client.list_workflows(f"WorkflowType = '{names.PIPELINE_WORKFLOW}'")
    ]
    assert not [w for w in started if w.id.startswith(name)]
