"""``llm-agent`` steps whose tools are MCP servers, on the real Temporal dev server.

The MCP servers are real and on loopback: the ``mcp`` package's ``MCPServer``
(FastMCP) over stdio (started by the worker per call) and over streamable HTTP
on 127.0.0.1 (started here, stopped by PID), plus hand-written hostile stdio
servers (``support/mcp_server.py``). The model is the scripted loopback model
of ``fixtures/agent_model.py``; the worker process is the real stack with the
real ``mcp`` and ``language_model`` tools.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import support
from conftest import Stack, running_stack
from fixtures.agent_model import (  # noqa: F401  (module fixture)
    ScriptedModel,
    call,
    models_file,
    say,
    scripted_model,
)
from prometheus_client import CollectorRegistry
from support.mcp_http import running_mcp_http
from support.pipelines import pipeline_result
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.mcp import McpServersFile
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.process.resources import build_language_model, build_tools

SCRIPT = Path(support.__file__).parent / "mcp_server.py"


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The real MCP server over streamable HTTP on loopback; its URL."""
    with running_mcp_http() as url:
        yield url


def _pids_with(tag: str) -> list[int]:
    """Processes whose command line carries ``tag`` (the stdio servers of one test)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmd:
                out.append(int(entry.name))
    return out


@dataclass
class McpStack:
    stack: Stack
    model: ScriptedModel
    name: str
    tag: str
    last_id: str = ""

    async def run(
        self, tools: list[Any], tenant: str = "acme", max_turns: int = 5
    ) -> PipelineResult:
        step = {
            "id": "agent",
            "worker": names.LLM_AGENT,
            "input": {
                "prompt": "Use the tools.",
                "model": "openai-agent",
                "tools": tools,
                "max_turns": max_turns,
            },
        }
        spec = {"name": "mcp-agent", "tenant": tenant, "steps": [step], "output": {}}
        handle = await self.stack.start(spec)
        self.last_id = handle.id
        result: PipelineResult = await asyncio.wait_for(pipeline_result(handle), 90)
        return result

    def left_running(self) -> list[int]:
        return _pids_with(self.tag)


@pytest_asyncio.fixture
async def mcp_agents(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    scripted_model: ScriptedModel,
    http_server: str,
) -> AsyncIterator[McpStack]:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    tag = f"mcp-test-{uuid.uuid4().hex[:8]}"
    py = [sys.executable, str(SCRIPT)]
    servers = {
        "calc": {"command": [*py, "stdio", tag], "tenants": ["acme"]},
        # the bound covers the server's start (~0.6 s of imports when idle): room for a
        # loaded machine, so only the hanging tool runs into it
        "slow": {"command": [*py, "stdio", tag], "timeout_seconds": 6},
        "web": {"url": http_server},
        "liar": {"command": [*py, "raw", "lying-output", tag]},
        "badschema": {"command": [*py, "raw", "bad-schema", tag]},
        "biglist": {"command": [*py, "raw", "huge-list", tag]},
    }
    servers_path = tmp_path / "mcp.json"
    servers_path.write_text(json.dumps({"servers": servers}), "utf-8")
    path = models_file(scripted_model, tmp_path / "models.json", name)
    s = Settings.model_validate(
        settings.model_dump()
        | {
            "models_file": path,
            "mcp_servers_file": servers_path,
            "mcp_servers": McpServersFile.model_validate({"servers": servers}),
        }
    )
    tools = build_tools(s)
    tools["language_model"] = build_language_model(
        s, {}, llm_metrics=LlmMetrics(CollectorRegistry())
    )
    try:
        async with running_stack(client, s, tools=tools) as stack:
            yield McpStack(stack, scripted_model, name, tag)
    finally:
        await tools["language_model"].aclose()
        if "fetch_url" in tools:
            await tools["fetch_url"].aclose()


async def _activities(client: Client, workflow_id: str) -> list[tuple[str, str]]:
    history = await client.get_workflow_handle(f"{workflow_id}/agent").fetch_history()
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            json.loads(e.user_metadata.summary.data),
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def _tool_reply(result: PipelineResult, index: int) -> dict[str, Any]:
    msg = result.steps["agent"].outputs["transcript"][index]
    assert msg["role"] == "tool", msg
    body: dict[str, Any] = json.loads(msg["content"])
    return body


@pytest.mark.timeout(120)
async def test_an_agent_calls_a_stdio_mcp_tool_and_uses_its_answer(mcp_agents: McpStack) -> None:
    a = mcp_agents
    a.model.script(
        a.name,
        call(("mcp__calc__add", {"a": 2, "b": 40}), text="Adding."),
        say("The sum is 42."),
    )
    result = await a.run(["mcp:calc/add", "validator"])
    step = result.steps["agent"]
    assert result.status == "succeeded", step
    o = step.outputs
    assert (o["answer"], o["tool_calls"], o["tool_errors"]) == ("The sum is 42.", 1, 0)
    assert o["calls"] == {"mcp__calc__add": 1}
    reply = _tool_reply(result, 2)
    assert reply["outputs"]["structured"] == {"sum": 42}
    # the model was offered the MCP tool with the input schema the server listed
    first, second = a.model.seen(a.name)
    offered = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
    assert set(offered) == {"mcp__calc__add", "validator"}
    assert offered["mcp__calc__add"]["parameters"]["required"] == ["a", "b"]
    assert second.body["messages"][-1]["role"] == "tool"
    # the listing and the call are activities of their own (recorded in history)
    wid = a.last_id
    assert await _activities(a.stack.client, wid) == [
        ("mcp-call", "agent list mcp:calc"),
        ("llm-call", "agent turn 1"),
        ("mcp-call", "agent turn 1 mcp__calc__add"),
        ("llm-call", "agent turn 2"),
    ]
    # each MCP call is an external call of the budget (2 turns + list + call)
    assert result.usage.external_calls == 4
    assert a.left_running() == []


@pytest.mark.timeout(120)
async def test_a_wildcard_lists_an_http_server_and_its_tool_answers(mcp_agents: McpStack) -> None:
    a = mcp_agents
    a.model.script(a.name, call(("mcp__web__shout", {"text": "hello"})), say("done"))
    result = await a.run(["mcp:web/*"])
    assert result.status == "succeeded", result.steps["agent"]
    assert _tool_reply(result, 2)["outputs"]["text"] == "HELLO!"
    offered = {t["function"]["name"] for t in a.model.seen(a.name)[0].body["tools"]}
    assert offered == {f"mcp__web__{t}" for t in ("add", "shout", "hang", "crash", "huge")}


@pytest.mark.timeout(120)
async def test_a_hanging_a_crashing_and_a_huge_tool_each_come_back_as_a_clear_error(
    mcp_agents: McpStack,
) -> None:
    a = mcp_agents
    a.model.script(
        a.name,
        call(
            ("mcp__slow__hang", {}),
            ("mcp__calc__crash", {}),
            ("mcp__calc__huge", {"mb": 3}),
            ("mcp__liar__count", {"text": "a b"}),
        ),
        say("all failed"),
    )
    result = await a.run(["mcp:slow/hang", "mcp:calc/*", "mcp:liar/count"])
    assert result.status == "succeeded", result.steps["agent"]
    errors = [_tool_reply(result, i)["error"] for i in (2, 3, 4, 5)]
    assert [e["code"] for e in errors] == [
        "timeout",
        "upstream_error",
        "payload_too_large",
        "invalid_output",
    ], errors
    assert "did not answer within 6 s" in errors[0]["message"]
    assert "exited with code 3" in errors[1]["message"]
    assert "its own output schema" in errors[3]["message"]
    # every stdio server this test started (each attempt's) is gone
    assert a.left_running() == []


@pytest.mark.timeout(120)
async def test_refusals_fail_the_step_with_a_stable_code(mcp_agents: McpStack) -> None:
    a = mcp_agents
    a.model.script(a.name, say("never asked"))
    cases = [
        (["mcp:calc/add"], "globex", "access_denied", "may not use MCP server 'calc'"),
        (["mcp:calc/divide"], "acme", "invalid_input", "lists no tool 'divide'"),
        (["mcp:nosuch/x"], "acme", "invalid_input", "unknown MCP server 'nosuch'"),
        (["mcp:badschema/*"], "acme", "invalid_output", "not a valid JSON Schema"),
        (["mcp:biglist/*"], "acme", "payload_too_large", "max_response_bytes"),
    ]
    for tools, tenant, code, words in cases:
        result = await a.run(tools, tenant=tenant)
        step = result.steps["agent"]
        assert (step.status, step.error_code) == ("failed", code), (tools, step)
        assert words in (step.error_message or ""), step.error_message
    # no model turn ran for any of them
    assert a.model.seen(a.name) == []
    assert a.left_running() == []
