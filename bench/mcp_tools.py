"""An MCP tool call through an ``llm-agent`` step against the same call made directly.

One embedded Temporal server, one ``aiworker worker`` process whose
``AIWORKER_MCP_SERVERS_FILE`` declares a stdio server (the ``mcp`` package's
``MCPServer`` of ``tests/support/mcp_server.py``) and whose ``openai-agent``
alias is the scripted loopback model of ``tests/fixtures/agent_model.py``
(answers at once: the bench measures aiworker and MCP, not a model). Rounds
alternate, one at a time, between:

- **direct**: what a developer writes with the ``mcp`` package: ``stdio_client``
  starts the server, ``ClientSession.initialize``, ``call_tool("add")``, close;
- **agent**: ``PipelineWorkflow`` with one llm-agent step whose tool is
  ``mcp:calc/add``; the model asks for one call, then answers. The figure is the
  tool call's ``mcp-call`` activity as the agent's history records it, from
  ``ActivityTaskScheduled`` to ``ActivityTaskCompleted``: the task's dispatch to
  the worker, the runtime's checks, the stdio server's start (one per call, see
  ``activities/tools/mcp.py``), the call, the bounded stop, the result recorded.

``ratio`` = the median over rounds of agent tool call ms / direct ms (each
round's two back to back, so the load on the shared cores hits both alike).
The whole agent step (the listing, two model turns, the call) is reported beside
it as ``agent_step_ms``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from bench.common import embedded_server, percentiles, standalone, worker_env
from bench.scale_out import _polling, _Proc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.agent_model import call, models_file, say, start_scripted_model  # noqa: E402

SCRIPT = ROOT / "tests" / "support" / "mcp_server.py"
COMMAND = ".venv/bin/python -m bench.mcp_tools"


async def direct() -> float:
    """ms of one call as the mcp package makes it: start, initialize, call, stop."""
    params = StdioServerParameters(command=sys.executable, args=[str(SCRIPT), "stdio"])
    t0 = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("add", {"a": 2, "b": 40})
    ms = (time.perf_counter() - t0) * 1000
    assert result.structured_content == {"sum": 42}, result
    return ms


async def agent(client: Client, queue: str, n: int) -> dict[str, float]:
    """One agent step with one MCP tool call: the call's activity ms and the step's."""
    wid = f"bench-mcp-{uuid.uuid4().hex[:8]}-{n}"
    spec = {
        "name": "bench-mcp",
        "tenant": "bench",
        "steps": [
            {
                "id": "agent",
                "worker": names.LLM_AGENT,
                "input": {
                    "prompt": "What is 2 + 40?",
                    "model": "openai-agent",
                    "tools": ["mcp:calc/add"],
                    "max_turns": 3,
                },
            }
        ],
        "output": {"answer": "${{ steps.agent.outputs.answer }}"},
    }
    handle = await client.start_workflow(names.PIPELINE_WORKFLOW, spec, id=wid, task_queue=queue)
    result = await handle.result()
    assert result["status"] == "succeeded", json.dumps(result)[:2000]
    history = await client.get_workflow_handle(f"{wid}/agent").fetch_history()
    scheduled: dict[int, tuple[str, float]] = {}
    spans: dict[str, float] = {}
    first = history.events[0].event_time.ToDatetime().timestamp()
    last = history.events[-1].event_time.ToDatetime().timestamp()
    for e in history.events:
        at = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            summary = json.loads(e.user_metadata.summary.data)
            scheduled[e.event_id] = (summary, at)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            summary, t = scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
            spans[summary] = (at - t) * 1000
    return {"tool_call_ms": spans["agent turn 1 mcp__calc__add"], "step_ms": (last - first) * 1000}


async def run(quick: bool = False) -> dict[str, Any]:
    rounds = 6 if quick else 20
    model = start_scripted_model()
    direct_ms: list[float] = []
    tool_ms: list[float] = []
    step_ms: list[float] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="aiworker-bench-mcp-") as tmp,
            embedded_server() as server,
        ):
            models = models_file(model, Path(tmp) / "models.json", "bench-mcp")
            model.script("bench-mcp", call(("mcp__calc__add", {"a": 2, "b": 40})), say("42"))
            servers = Path(tmp) / "mcp.json"
            command = [sys.executable, str(SCRIPT), "stdio"]
            servers.write_text(json.dumps({"servers": {"calc": {"command": command}}}))
            suffix = f"-mcp{uuid.uuid4().hex[:6]}"
            env = worker_env(
                server.address,
                suffix,
                Path(tmp) / "data",
                AIWORKER_MODELS_FILE=str(models),
                AIWORKER_MCP_SERVERS_FILE=str(servers),
            )
            worker = _Proc(env, Path(tmp) / "worker.log")
            try:
                client = await Client.connect(server.address, data_converter=data_converter(None))
                queue = f"{names.PIPELINES_QUEUE}{suffix}"
                await _polling(client, queue, worker.pid)
                await direct()  # warm-up: imports, the first workflow tasks
                await agent(client, queue, 0)
                for i in range(rounds):
                    for path in ("direct", "agent") if i % 2 == 0 else ("agent", "direct"):
                        if path == "direct":
                            direct_ms.append(await direct())
                        else:
                            a = await agent(client, queue, i + 1)
                            tool_ms.append(a["tool_call_ms"])
                            step_ms.append(a["step_ms"])
            finally:
                worker.stop()
    finally:
        model.stop()
    paired = [t / d for t, d in zip(tool_ms, direct_ms, strict=True)]
    return {
        "ratio": round(statistics.median(paired), 3),
        "ratio_of_p50s": round(statistics.median(tool_ms) / statistics.median(direct_ms), 3),
        "rounds_ratio": [round(r, 3) for r in paired],
        "direct_ms": percentiles(direct_ms),
        "agent_tool_call_ms": percentiles(tool_ms),
        "agent_step_ms": percentiles(step_ms),
        "rounds": rounds,
        "command": ("BENCH_QUICK=1 " if quick else "") + COMMAND,
    }


if __name__ == "__main__":
    standalone(run)
