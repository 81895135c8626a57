"""``llm-agent`` steps on the real Temporal dev server, against a scripted model.

The model is ``fixtures/agent_model.py`` (OpenAI tool calling and Anthropic
tool use on loopback), the tools are the real built-in workers (web-scrape on
a loopback page that logs its hits, validator), the worker process is the
real stack with the real ``language_model`` tool, and one pipeline is started
with the ``temporal`` CLI as a user would. Long on purpose: one place for
the agent's whole behaviour (the task, tool errors, each bound, both formats).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from support.loopback import Exchange, Loopback
from support.pipelines import pipeline_result
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workers.process.resources import build_language_model, build_tools

PAGE = "<html><body><h1>Kettle</h1><span class='price'>39.90</span></body></html>"
PRICE_SCHEMA = {
    "type": "object",
    "required": ["price"],
    "properties": {"price": {"type": "number"}},
}


@dataclass
class Site:
    """A loopback page that counts its hits (the proof a tool call ran once)."""

    server: Loopback
    hits: Counter[str]

    def url(self, path: str) -> str:
        return self.server.base_url + path


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    hits: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(ex: Exchange) -> None:
        with lock:
            hits[ex.path] += 1
        if ex.path == "/robots.txt":
            ex.send(404, b"")
        elif ex.path.startswith("/kettle"):
            ex.send(200, PAGE.encode())
        else:
            ex.send(404, b"<h1>not here</h1>")

    server = Loopback(handle).start()
    try:
        yield Site(server, hits)
    finally:
        server.stop()


@dataclass
class AgentStack:
    stack: Stack
    model: ScriptedModel
    name: str  # the scripted model's name (fresh per test)

    async def run(self, agent_input: dict[str, Any], **pipeline: Any) -> PipelineResult:
        step = {"id": "agent", "worker": names.LLM_AGENT, "input": agent_input}
        step.update(pipeline.pop("step", {}))
        spec = {"name": "agent", "tenant": "acme", "steps": [step], "output": {}, **pipeline}
        handle = await self.stack.start(spec)
        return await asyncio.wait_for(pipeline_result(handle), 90)


@pytest_asyncio.fixture
async def agents(
    client: Client, settings: Settings, tmp_path: Path, scripted_model: ScriptedModel
) -> AsyncIterator[AgentStack]:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    path = models_file(scripted_model, tmp_path / "models.json", name)
    s = Settings.model_validate(settings.model_dump() | {"models_file": path})
    tools = build_tools(s)  # the real tools: web-scrape fetches and parses for real
    tools["language_model"] = build_language_model(
        s, {}, llm_metrics=LlmMetrics(CollectorRegistry())
    )
    try:
        async with running_stack(client, s, tools=tools) as stack:
            yield AgentStack(stack, scripted_model, name)
    finally:
        await tools["language_model"].aclose()
        await tools["fetch_url"].aclose()


def two_tool_turns(site: Site, page: str) -> list[Any]:
    scrape = {
        "url": site.url(page),
        "extraction_spec": {"fields": {"price": {"selector": ".price", "type": "number"}}},
    }
    check = {"data": {"price": 39.9}, "schema": PRICE_SCHEMA}
    return [
        call(("web-scrape", scrape), text="Let me look at the page."),
        call(("validator", check)),
        say("The kettle costs 39.90."),
    ]


async def child_activities(client: Client, workflow_id: str) -> list[tuple[str, str]]:
    """(activity type, activity id) of each activity the agent child scheduled."""
    handle = client.get_workflow_handle(f"{workflow_id}/agent")
    history = await handle.fetch_history()
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            json.loads(e.user_metadata.summary.data),
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


@pytest.mark.timeout(120)
async def test_a_pipeline_started_with_the_temporal_cli_runs_a_two_tool_task(
    agents: AgentStack, site: Site, tmp_path: Path
) -> None:
    page = f"/kettle-{uuid.uuid4().hex[:6]}"
    agents.model.script(agents.name, *two_tool_turns(site, page))
    pipeline = {
        "name": "kettle-agent",
        "tenant": "acme",
        "budget": {"max_tokens": 5000, "max_external_calls": 20, "deadline_seconds": 120},
        "steps": [
            {
                "id": "agent",
                "worker": "llm-agent",
                "input": {
                    "prompt": "What does the kettle cost? Check the number.",
                    "model": "openai-agent",
                    "tools": ["web-scrape", {"worker": "validator", "max_calls": 2}],
                    "max_turns": 5,
                },
            }
        ],
        "output": {"answer": "${{ steps.agent.outputs.answer }}"},
    }
    file = tmp_path / "pipeline.json"
    file.write_text(json.dumps(pipeline), "utf-8")
    wid = f"kettle-{uuid.uuid4().hex[:8]}"
    client = agents.stack.client
    proc = await asyncio.create_subprocess_exec(
        str(temporal_cli_path()),
        "workflow",
        "start",
        "--type",
        names.PIPELINE_WORKFLOW,
        "--task-queue",
        agents.stack.pipelines_queue,
        "--workflow-id",
        wid,
        "--input-file",
        str(file),
        "--address",
        client.service_client.config.target_host,
        "--namespace",
        client.namespace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    handle = client.get_workflow_handle(wid, result_type=PipelineResult)
    result = await asyncio.wait_for(handle.result(), 90)

    step = result.steps["agent"]
    assert result.status == "succeeded", step
    assert result.output == {"answer": "The kettle costs 39.90."}
    o = step.outputs
    assert (o["stopped"], o["turns"], o["tool_calls"], o["tool_errors"]) == ("answer", 3, 2, 0), (
        json.dumps(o["transcript"])
    )
    assert o["calls"] == {"web-scrape": 1, "validator": 1}
    roles = [m["role"] for m in o["transcript"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    scraped = json.loads(o["transcript"][2]["content"])
    assert scraped["outputs"]["data"] == {"price": 39.9}
    assert json.loads(o["transcript"][4]["content"])["outputs"]["valid"] is True
    # usage: three turns of 110 tokens, three model calls and one page fetch
    assert (result.usage.input_tokens, result.usage.output_tokens) == (300, 30)
    assert result.usage.external_calls == 4
    assert site.hits[page] == 1
    # every turn and tool call is its own activity in the agent's history
    assert await child_activities(client, wid) == [
        ("llm-call", "agent turn 1"),
        ("web-scrape", "agent turn 1 web-scrape"),
        ("llm-call", "agent turn 2"),
        ("validator", "agent turn 2 validator"),
        ("llm-call", "agent turn 3"),
    ]
    # the model got the tools from the workers' specs, and the results as tool messages
    first, _, third = agents.model.seen(agents.name)
    tools = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
    assert set(tools) == {"web-scrape", "validator"}
    assert tools["validator"]["parameters"]["required"] == ["data", "schema"]
    assert "$schema" not in tools["validator"]["parameters"]
    said = third.body["messages"][1]
    assert said["role"] == "assistant" and said["tool_calls"][0]["function"]["name"] == "web-scrape"
    assert third.body["messages"][2]["role"] == "tool"
    assert third.body["messages"][2]["tool_call_id"] == said["tool_calls"][0]["id"]


async def test_tool_errors_go_back_to_the_model_and_the_run_completes(
    agents: AgentStack, site: Site
) -> None:
    agents.model.script(
        agents.name,
        call(("publish", {"sink": {"file": "x.jsonl"}, "record": {}})),  # not allowed
        call(("validator", {"data": 1})),  # misses "schema"
        call(("validator", '{"data": 1, "schema": ')),  # broken JSON
        # the tool fails: not_found
        call(
            (
                "web-scrape",
                {"url": site.url("/missing"), "extraction_spec": {"fields": {"t": "h1"}}},
            )
        ),
        say("I could not do it."),
    )
    result = await agents.run(
        {"prompt": "Try.", "model": "openai-agent", "tools": ["validator", "web-scrape"]}
    )
    step = result.steps["agent"]
    assert result.status == "succeeded", step
    o = step.outputs
    assert (o["answer"], o["turns"], o["tool_calls"], o["tool_errors"]) == (
        "I could not do it.",
        5,
        4,
        4,
    )
    assert o["errors"] == {"tool_not_allowed": 1, "invalid_input": 2, "not_found": 1}
    assert o["calls"] == {"web-scrape": 1}  # the refused calls never ran
    errors = [json.loads(m["content"])["error"] for m in o["transcript"] if m["role"] == "tool"]
    assert all(m["is_error"] for m in o["transcript"] if m["role"] == "tool")
    assert errors[0]["code"] == "tool_not_allowed" and "'publish'" in errors[0]["message"]
    assert "validator, web-scrape" in errors[0]["message"]
    assert (
        errors[1]["code"] == "invalid_input"
        and "$: missing required key 'schema'" in errors[1]["message"]
    )
    assert "got text that is not JSON" in errors[2]["message"]
    assert errors[3]["code"] == "not_found"
    # what the model saw on its last turn: the four errors as tool messages
    last = agents.model.seen(agents.name)[-1].body["messages"]
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert len(tool_msgs) == 4 and "tool_not_allowed" in tool_msgs[0]["content"]


@pytest.mark.parametrize(
    ("bound", "turns", "extra", "pipeline_status"),
    [
        ("max_turns", 3, {"max_turns": 3}, "failed"),
        ("max_calls", 2, {"tools": [{"worker": "validator", "max_calls": 1}]}, "failed"),
        ("tokens", 3, {}, "budget_exhausted"),
        ("external_calls", 2, {}, "budget_exhausted"),
    ],
)
async def test_each_bound_ends_the_step_with_its_code_and_the_transcript(
    agents: AgentStack, bound: str, turns: int, extra: dict[str, Any], pipeline_status: str
) -> None:
    # a model that never stops calling the validator
    agents.model.script(agents.name, call(("validator", {"data": 1, "schema": {}})))
    budget = {
        "tokens": {"max_tokens": 300},
        "external_calls": {"max_external_calls": 2},
    }.get(bound, {})
    agent_input = {"prompt": "Loop.", "model": "openai-agent", "tools": ["validator"], **extra}
    result = await agents.run(agent_input, budget=budget)
    step = result.steps["agent"]
    assert result.status == pipeline_status, step
    assert step.status == "failed" and step.error_code == "budget_exceeded", step
    assert step.reasons[0]["resource"] == bound
    o = step.outputs
    assert o["stopped"] == bound and o["answer"] is None and o["turns"] == turns
    assert [m["role"] for m in o["transcript"]][:3] == ["user", "assistant", "tool"]
    assert result.error is not None and result.error.code == "budget_exceeded"


async def test_the_deadline_cuts_a_turn_in_flight(agents: AgentStack) -> None:
    never = threading.Event()
    agents.model.script(
        agents.name, call(("validator", {"data": 1, "schema": {}})), call(hold=never)
    )
    try:
        result = await agents.run(
            {"prompt": "Wait.", "model": "openai-agent", "tools": ["validator"]},
            step={"timeout_seconds": 3},
        )
    finally:
        never.set()
    step = result.steps["agent"]
    assert step.error_code == "budget_exceeded" and step.reasons[0]["resource"] == "deadline"
    assert "during turn 2" in (step.error_message or "")
    assert step.outputs["stopped"] == "deadline" and step.outputs["calls"] == {"validator": 1}


async def test_anthropic_tool_use_runs_the_same_task(agents: AgentStack, site: Site) -> None:
    agents.model.script(agents.name, *two_tool_turns(site, "/kettle-anthropic"))
    result = await agents.run(
        {
            "prompt": "What does the kettle cost?",
            "system": "Use the tools.",
            "model": "claude-agent",
            "tools": ["web-scrape", "validator"],
        }
    )
    step = result.steps["agent"]
    assert result.status == "succeeded", step
    assert step.outputs["answer"] == "The kettle costs 39.90."
    assert step.outputs["calls"] == {"web-scrape": 1, "validator": 1}
    seen = agents.model.seen(agents.name)
    assert [r.path for r in seen] == ["/v1/messages"] * 3
    first, _, third = seen
    assert first.body["system"] == "Use the tools."
    assert {t["name"] for t in first.body["tools"]} == {"web-scrape", "validator"}
    assert "input_schema" in first.body["tools"][0] and "tool_choice" not in first.body
    assistant, results = third.body["messages"][1], third.body["messages"][2]
    assert assistant["role"] == "assistant"
    assert [b["type"] for b in assistant["content"]] == ["text", "tool_use"]
    assert results["role"] == "user"
    block = results["content"][0]
    assert block["type"] == "tool_result" and block["tool_use_id"] == assistant["content"][1]["id"]
    assert json.loads(block["content"])["outputs"]["data"] == {"price": 39.9}


async def test_a_final_answer_that_misses_response_schema_goes_back_to_the_model(
    agents: AgentStack,
) -> None:
    agents.model.script(agents.name, say("about forty"), say('{"price": 39.9}'))
    result = await agents.run(
        {
            "prompt": "Price?",
            "model": "openai-agent",
            "tools": ["validator"],
            "response_schema": PRICE_SCHEMA,
        }
    )
    step = result.steps["agent"]
    assert result.status == "succeeded", step
    assert step.outputs["json"] == {"price": 39.9} and step.outputs["turns"] == 2
    rejection = step.outputs["transcript"][1]
    assert rejection["role"] == "user" and rejection["content"].startswith(
        "Your answer was rejected"
    )


async def test_an_unknown_tool_in_the_allow_list_is_invalid_input_before_any_turn(
    agents: AgentStack,
) -> None:
    result = await agents.run(
        {"prompt": "x", "model": "openai-agent", "tools": ["${{ inputs.tool }}"]},
        inputs={"tool": "no-such-worker"},
    )
    step = result.steps["agent"]
    assert step.error_code == "invalid_input", step
    assert "'input.tools[0]'" in (step.error_message or "")
    assert "unknown worker 'no-such-worker'" in (step.error_message or "")
    assert agents.model.seen(agents.name) == []


async def test_tools_named_by_an_earlier_steps_outputs_are_recorded_and_called(
    agents: AgentStack,
) -> None:
    """The tool list is known only when the step runs, so the run recorded every
    worker its process knows, and the agent calls the one the outputs name."""
    agents.model.script(
        agents.name, call(("validator", {"data": 1, "schema": {}})), say("Checked.")
    )
    pick = {
        "id": "pick",
        "worker": "aggregator",
        "input": {"policy": "all", "branches": {"tools": ["validator"]}},
    }
    agent_input = {
        "prompt": "Check it.",
        "model": "openai-agent",
        "tools": "${{ steps.pick.outputs.result.tools }}",
    }
    agent = {"id": "agent", "worker": names.LLM_AGENT, "input": agent_input}
    handle = await agents.stack.start({"name": "picked", "steps": [pick, agent]})
    result = await asyncio.wait_for(handle.result(), 90)
    step = result.steps["agent"]
    assert step.status == "succeeded", step
    assert step.outputs["calls"] == {"validator": 1}
    assert step.outputs["tool_errors"] == 0


def test_aiworker_check_refuses_an_agent_step_it_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiworker.workers.cli import main as cli

    doc = {
        "name": "bad-agent",
        "steps": [
            {
                "id": "agent",
                "worker": "llm-agent",
                "for_each": [1, 2],
                "input": {"prompt": "x", "tools": ["validator", "no-such", "llm-agent"]},
            }
        ],
    }
    file = tmp_path / "p.json"
    file.write_text(json.dumps(doc), "utf-8")
    assert cli.main(["check", str(file)]) == 2
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "step 'agent': field 'for_each': an llm-agent step runs as a child workflow" in err
    assert "field 'input.tools[1]': unknown worker 'no-such'" in err
    assert "field 'input.tools[2]': 'llm-agent' runs as a workflow and cannot be a tool" in err
