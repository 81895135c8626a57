"""Record workflow histories for the replay gate (``aiworker replay``, ``test_replay.py``).

Run from the repository root (a few minutes; it starts its own dev server)::

    .venv/bin/python tests/workflows/record_histories.py            # every recording
    .venv/bin/python tests/workflows/record_histories.py cancel agent  # only these
    .venv/bin/python tests/workflows/record_histories.py --list
    .venv/bin/python tests/workflows/record_histories.py --out /tmp/h  # to look first

Each recording runs one pipeline shape on the current code and writes the
history of the pipeline (and of the child workflows named) as
``tests/workflows/histories/<name>.json``, the JSON ``temporal workflow show
--output json`` writes; the workflow id a replay needs is in its first event.
It overwrites only the files it records; every other file there stays.

Record again with every change to a pinned workflow's code (pipeline, chunk,
agent, eval) and commit the new files in the same change: a pinned run ends on
the build it started on and never replays on newer code, so no copy of an older
shape is kept; from then on the replay gate guards that change. An auto-upgrade
workflow (limiter, breaker, registry, flow) does replay on newer code: change it
behind ``workflow.patched`` with its plan (docs/replay.md), and keep a history
that takes a patch's old branch (``breaker-20261127.json``) until the plan
removes that branch. Never record to make a failing replay pass.
``recorded-specs.json`` comes from ``test_recorded_specs.py`` instead
(``AIWORKER_RECORD_HISTORIES=1``).

Shapes: DAG with gates, a skipped ``when`` and local activities (validator and
aggregator run as local activities), for_each (chunk children; a tree of
chunks of chunks; items by reference), the validation loop with fallback and
budget refusal, review (retry, approve, reject, timeout), redrive, llm-agent
with a scripted loopback model (parent and child; and under a tenant's rate
limits, its turns and tool calls waiting for permits: ``agent-limited``; with an
MCP server's tool, listed and called through ``mcp-call``: ``agent-mcp``), cancel, and a run started
by a Temporal Schedule, the live worker registry (publish, expiry, withdraw),
and rate-limited for_each items with their limiters (leased blocks, queued), and
for_each items several to an activity task (``items_per_task``, with a retry round),
and a for_each whose ``tolerated_failures`` was passed (a chunk and its items cancelled),
the keyed flow workflow in each mode (``flow``), a schedule's start of a flow
pipeline (``flow-scheduled``), and an eval run (``EvalWorkflow``: items through a
worker's own queue).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent.parent)]

from conftest import Stack, running_stack  # noqa: E402
from fixtures.agent_model import call, models_file, say, start_scripted_model  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from support.loopback import Exchange, Loopback  # noqa: E402
from support.payloads import stack_settings, workflow_tree  # noqa: E402
from support.pipelines import (  # noqa: E402
    lost_call_pipeline,
    pipeline_result,
)
from support.registry import entry, publish_raw  # noqa: E402
from support.standins import fail, standin  # noqa: E402
from support.waiting import wait_until  # noqa: E402
from temporalio import activity  # noqa: E402
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from aiworker.activities.llm import LlmMetrics  # noqa: E402
from aiworker.config.settings import Settings, parse_rate_limits  # noqa: E402
from aiworker.schemas import names  # noqa: E402
from aiworker.schemas.callbacks import make_token  # noqa: E402
from aiworker.schemas.tenants import TenantRegistry  # noqa: E402
from aiworker.workers.client.client import PipelineClient  # noqa: E402
from aiworker.workers.client.temporal_client import data_converter  # noqa: E402
from aiworker.workers.devstack.devserver import local_server_extra_args, temporal_cli_path  # noqa: E402
from aiworker.workers.process.live_registry import read_registry  # noqa: E402
from aiworker.workers.process.resources import build_language_model, build_tools  # noqa: E402
from aiworker.workers.schedules.schedules import create_schedule, trigger_schedule  # noqa: E402
from aiworker.workers.schedules.specs import ScheduleOptions, parse_interval  # noqa: E402
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow  # noqa: E402

OUT = HERE / "histories"

DAG = {
    "name": "replay-dag",
    "tenant": "acme",
    "inputs": {"doc": {"title": "Mug", "price": 9}},
    "steps": [
        {
            "id": "check",
            "worker": "validator",
            "input": {"data": "${{ inputs.doc }}", "schema": {"required": ["title"]}},
        },
        {
            "id": "also",
            "worker": "validator",
            "input": {"data": "${{ inputs.doc }}", "schema": {"required": ["nope"]}},
        },
        {
            "id": "merge",
            "worker": "aggregator",
            "input": {
                "policy": "merge",
                "branches": {"a": "${{ steps.check.outputs }}", "b": "${{ steps.also.outputs }}"},
            },
        },
        {
            "id": "pub",
            "worker": "publish",
            "gate": "check",
            "input": {"sink": {"file": "replay.jsonl"}, "record": "${{ inputs.doc }}"},
        },
        {
            "id": "blocked",
            "worker": "publish",
            "gate": "also",
            "input": {"sink": {"file": "replay.jsonl"}, "record": 1},
        },
        {
            "id": "skipped",
            "worker": "validator",
            "when": {"value": "${{ inputs.doc.price }}", "schema": {"minimum": 100}},
            "input": {"data": 1, "schema": {}},
        },
    ],
    "output": {"valid": "${{ steps.check.outputs.valid }}"},
}

FOR_EACH = {
    "name": "replay-foreach",
    "steps": [
        {
            "id": "each",
            "worker": "validator",
            "for_each": [{"n": 1}, {"n": "x"}, {"n": 3}],
            "chunk_size": 2,
            "max_parallel": 2,
            "input": {"data": "${{ item }}", "schema": {"properties": {"n": {"type": "integer"}}}},
        },
        {
            "id": "concat",
            "worker": "aggregator",
            "input": {"policy": "concat", "branches": [[1, 2], [2, 3]]},
        },
    ],
}

LOOP = {
    "name": "replay-loop",
    "budget": {"max_external_calls": 0},
    "steps": [
        {
            "id": "make",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {"a": 1}},
            "validate": {"schema": {"required": ["never"]}, "max_attempts": 2},
            "fallback": "validator",
            "fallback_input": {"data": 1, "schema": {}},
            "on_failure": "continue",
        },
        {
            "id": "refused",
            "worker": "publish",
            "input": {"sink": {"webhook": "http://127.0.0.1:9/x"}, "record": 1},
            "depends_on": ["make"],
        },
    ],
}

REVIEW = {
    "name": "replay-review",
    "steps": [
        {
            "id": "draft",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {}},
            "on_failure": "escalate",
        }
    ],
}


ESCALATE = {
    "name": "replay-escalate",
    "steps": [
        {
            "id": "draft",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {}},
            "on_failure": "escalate",
        }
    ],
    "output": {"draft": "${{ steps.draft.outputs.result }}"},
}

REDRIVE = {
    "name": "replay-redrive",
    "steps": [
        {"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}},
        {
            "id": "pub",
            "worker": "publish",
            "depends_on": ["check"],
            "input": {"sink": {"file": "redrive.jsonl"}, "record": {"n": 1}},
        },
    ],
}

TREE = {
    "name": "replay-tree",
    "steps": [
        {
            "id": "each",
            "worker": "validator",
            # 40 leaf chunks of one item: more than FANOUT (32), so group chunks of leaves
            "for_each": list(range(40)),
            "chunk_size": 1,
            "max_parallel": 40,
            "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
        }
    ],
}

BY_REFERENCE = {
    "name": "replay-items",
    "steps": [
        {
            "id": "each",
            "worker": "validator",
            "for_each": [{"n": 1}, {"n": 2}, {"n": 3}, {"n": "x"}, {"n": 5}],
            "chunk_size": 2,
            "input": {"data": "${{ item }}", "schema": {"properties": {"n": {"type": "integer"}}}},
        },
        {
            # reads the list held by reference: the items are loaded for it
            "id": "all",
            "worker": "aggregator",
            "input": {"policy": "concat", "branches": ["${{ steps.each.outputs.items }}"]},
        },
    ],
}

CANCEL = {
    "name": "replay-cancel",
    "steps": [
        {"id": "slow", "worker": "publish", "input": {"sink": {"file": "c"}, "record": {}}},
        {
            "id": "after",
            "worker": "validator",
            "depends_on": ["slow"],
            "input": {"data": 1, "schema": {}},
        },
    ],
}

SCHEDULED = {
    "name": "replay-scheduled",
    "steps": [{"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}}],
}

DRAFT = {"policy": "all", "result": {"ok": True}, "used": [], "failed": []}

Saved = dict[str, str]  # file name (without .json) -> workflow id
Recording = Callable[[Client, Path], Awaitable[Saved]]


def _settings(tmp: Path, **kw: Any) -> Settings:
    return stack_settings(tmp, **kw)


async def _ended(handle: Any) -> None:
    """Wait for a recorded run to end, however it ends: a pipeline that did not
    succeed fails its execution, and its history is what the recording keeps."""
    try:
        await handle.result()
    except WorkflowFailureError:
        pass


async def _run(stack: Stack, pipeline: dict[str, Any], wid: str) -> WorkflowHandle[Any, Any]:
    handle = await stack.start(pipeline, id=wid)
    await _ended(handle)
    return handle


async def rec_basic(client: Client, tmp: Path) -> Saved:
    """DAG (gates, when, local activities), for_each (one chunk child), the loop."""
    async with running_stack(client, _settings(tmp)) as stack:
        for name, pipeline in (("dag", DAG), ("foreach", FOR_EACH), ("loop", LOOP)):
            await _run(stack, pipeline, f"replay-{name}")
    return {
        "dag": "replay-dag",
        "foreach": "replay-foreach",
        "foreach-chunk": "replay-foreach/each/0",
        "loop": "replay-loop",
    }


async def _escalated(
    client: Client, tmp: Path, wid: str, pipeline: dict[str, Any], update: dict[str, Any] | None
) -> None:
    """Run ``pipeline`` whose aggregator fails once, and answer its review with ``update``
    (None: let the review time out)."""
    calls: list[dict[str, Any]] = []

    async def draft(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 1:
            raise fail("invalid_output", "garbage")
        return DRAFT

    acts = {"aggregator": standin("aggregator", draft, calls)}
    async with running_stack(client, _settings(tmp), replace_activities=acts) as stack:
        handle = await stack.start(pipeline, id=wid)
        if update is not None:

            async def awaiting() -> bool:
                p = await handle.query(names.PROGRESS_QUERY)
                return bool(p["awaiting_review"])

            await wait_until(awaiting, "review")
            await handle.execute_update(names.REVIEW_UPDATE, update)
        await _ended(handle)


async def rec_review(client: Client, tmp: Path) -> Saved:
    """Escalation to a human: retry (the old ``review``), approve, reject, timeout."""
    await _escalated(client, tmp, "replay-review", REVIEW, {"decision": "retry", "reviewer": "r"})
    approve = {"decision": "approve", "reviewer": "r", "outputs": DRAFT, "note": "fine"}
    await _escalated(client, tmp, "replay-review-approve", ESCALATE, approve)
    reject = {"decision": "reject", "reviewer": "r", "note": "no"}
    await _escalated(client, tmp, "replay-review-reject", ESCALATE, reject)
    timeout = json.loads(json.dumps(ESCALATE))
    timeout["steps"][0]["review_timeout_seconds"] = 1
    await _escalated(client, tmp, "replay-review-timeout", timeout, None)
    return {
        "review": "replay-review",
        "review-approve": "replay-review-approve",
        "review-reject": "replay-review-reject",
        "review-timeout": "replay-review-timeout",
    }


async def rec_redrive(client: Client, tmp: Path) -> Saved:
    """A run whose publish fails, and its redrive (reusing ``check``)."""
    calls: list[dict[str, Any]] = []

    async def publish(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 1:
            raise fail("access_denied", "not yet")
        return {"written": True, "duplicate": False}

    settings = _settings(tmp)
    acts = {"publish": standin("publish", publish, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        await _run(stack, REDRIVE, "replay-redrive")
        pipelines = PipelineClient(client, settings)
        again = await pipelines.start_redrive(await pipelines.redrive_input("replay-redrive"))
        await _ended(again)
    return {"redrive-failed": "replay-redrive", "redrive": again.id}


async def rec_tree(client: Client, tmp: Path) -> Saved:
    """A for_each over more leaf chunks than one chunk may start: chunks of chunks."""
    async with running_stack(client, _settings(tmp)) as stack:
        await _run(stack, TREE, "replay-tree")
    tree = await workflow_tree(client, "replay-tree")
    depth = {wid: wid.count("/") for wid in tree}
    group = min((w for w in tree if depth[w] == 2), key=len)
    leaf = next(w for w in sorted(tree) if depth[w] > 2 and w.startswith(group + "/"))
    return {"foreach-tree": "replay-tree", "foreach-tree-group": group, "foreach-tree-leaf": leaf}


async def rec_items(client: Client, tmp: Path) -> Saved:
    """A for_each whose items are held by reference (over AIWORKER_FOREACH_INLINE_ITEMS)."""
    async with running_stack(client, _settings(tmp, foreach_inline_items=2)) as stack:
        await _run(stack, BY_REFERENCE, "replay-items")
    return {"items-ref": "replay-items", "items-ref-chunk": "replay-items/each/0"}


def _limited(tenant: str, n: int) -> dict[str, Any]:
    return {
        "name": "replay-limited",
        "tenant": tenant,
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": list(range(n)),
                "max_parallel": 4,
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            }
        ],
    }


async def rec_limiter(client: Client, tmp: Path) -> Saved:
    """Rate-limited for_each items and their limiters: permits from leased blocks (a
    limit high for its period) and queued at the limiter (a tight one)."""
    rules = "validator:replay-fast=100000/min,validator:replay-slow=3/2s"
    settings = _settings(tmp, rate_limits=tuple(parse_rate_limits(rules)))
    async with running_stack(client, settings) as stack:
        await _run(stack, _limited("replay-fast", 12), "replay-limited-fast")
        await _run(stack, _limited("replay-slow", 6), "replay-limited-slow")
    suffix = settings.task_queue_suffix
    return {
        "limited-blocks": "replay-limited-fast",
        "limited-blocks-chunk": "replay-limited-fast/each/0",
        "limiter-blocks": names.limiter_workflow_id("rate:validator:replay-fast", suffix),
        "limited-queued-chunk": "replay-limited-slow/each/0",
        "limiter-queued": names.limiter_workflow_id("rate:validator:replay-slow", suffix),
    }


async def _record_agent(
    client: Client, settings: Settings, pipeline: dict[str, Any], workflow_id: str
) -> None:
    """Run an agent pipeline on a stack whose language model reads ``settings``'s
    models file (the scripted model)."""
    tools = build_tools(settings)
    tools["language_model"] = build_language_model(
        settings, {}, llm_metrics=LlmMetrics(CollectorRegistry())
    )
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            await _run(stack, pipeline, workflow_id)
    finally:
        await tools["language_model"].aclose()
        await tools["fetch_url"].aclose()


def _agent_pipeline(name: str, prompt: str, tools: list[str]) -> dict[str, Any]:
    """One llm-agent step on the scripted model (``openai-agent``) with ``tools``."""
    return {
        "name": name,
        "tenant": "acme",
        "budget": {"max_tokens": 5000, "max_external_calls": 20, "deadline_seconds": 120},
        "steps": [
            {
                "id": "agent",
                "worker": "llm-agent",
                "input": {
                    "prompt": prompt,
                    "model": "openai-agent",
                    "tools": tools,
                    "max_turns": 3,
                },
            }
        ],
        "output": {"answer": "${{ steps.agent.outputs.answer }}"},
    }


async def rec_agent(client: Client, tmp: Path) -> Saved:
    """An llm-agent step (a child workflow) with one tool call, on a scripted model."""
    model = start_scripted_model()
    try:
        path = models_file(model, tmp / "models.json", "replay-agent")
        model.script(
            "replay-agent",
            call(("validator", {"data": {"n": 1}, "schema": {"type": "object"}})),
            say("It is valid."),
        )
        settings = _settings(tmp, models_file=path)
        pipeline = _agent_pipeline("replay-agent", "Is it valid?", ["validator"])
        await _record_agent(client, settings, pipeline, "replay-agent")
    finally:
        model.stop()
    return {"agent": "replay-agent", "agent-child": "replay-agent/agent"}


async def rec_agent_mcp(client: Client, tmp: Path) -> Saved:
    """An llm-agent step whose tool is an MCP server's (a stdio ``MCPServer`` of
    ``support/mcp_server.py``): the listing and the tool call are ``mcp-call``
    activities."""
    from aiworker.schemas.mcp import McpServersFile

    model = start_scripted_model()
    try:
        path = models_file(model, tmp / "models.json", "replay-agent-mcp")
        model.script(
            "replay-agent-mcp",
            call(("mcp__calc__add", {"a": 2, "b": 40})),
            say("The sum is 42."),
        )
        script = HERE.parent / "support" / "mcp_server.py"
        servers = McpServersFile.model_validate(
            {"servers": {"calc": {"command": [sys.executable, str(script), "stdio"]}}}
        )
        settings = _settings(tmp, models_file=path, mcp_servers=servers)
        pipeline = _agent_pipeline("replay-agent-mcp", "What is 2 + 40?", ["mcp:calc/*"])
        await _record_agent(client, settings, pipeline, "replay-agent-mcp")
    finally:
        model.stop()
    return {"agent-mcp": "replay-agent-mcp", "agent-mcp-child": "replay-agent-mcp/agent"}


async def rec_agent_limited(client: Client, tmp: Path) -> Saved:
    """An llm-agent step under a tenant's rate limits and worker list: each model turn
    and tool call waits for its permit at the limiter (``agent-turn-permits``)."""
    model = start_scripted_model()
    try:
        path = models_file(model, tmp / "models.json", "replay-agent-limited")
        model.script(
            "replay-agent-limited",
            call(
                ("validator", {"data": {"n": 1}, "schema": {"type": "object"}}),
                ("validator", {"data": [], "schema": {"type": "object"}}),
            ),
            say("One is valid."),
        )
        tenant = {
            "rate_limits": {"validator": "100/min", "llm-call": "100/min"},
            "workers": ["llm-agent", "llm-call", "validator"],
        }
        registry = TenantRegistry.model_validate({"tenants": {"replay-limited": tenant}})
        settings = _settings(tmp, models_file=path, tenants=registry)
        pipeline = {
            "name": "replay-agent-limited",
            "tenant": "replay-limited",
            "budget": {"max_tokens": 5000, "deadline_seconds": 120},
            "steps": [
                {
                    "id": "agent",
                    "worker": "llm-agent",
                    "input": {
                        "prompt": "Which is valid?",
                        "model": "openai-agent",
                        "tools": ["validator"],
                        "max_turns": 3,
                    },
                }
            ],
            "output": {"answer": "${{ steps.agent.outputs.answer }}"},
        }
        await _record_agent(client, settings, pipeline, "replay-agent-limited")
    finally:
        model.stop()
    return {
        "agent-limited": "replay-agent-limited",
        "agent-limited-child": "replay-agent-limited/agent",
    }


async def rec_cancel(client: Client, tmp: Path) -> Saved:
    """A pipeline cancelled while its first step's activity runs."""
    started = asyncio.Event()

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        from temporalio import activity

        started.set()
        for _ in range(600):
            activity.heartbeat()
            await asyncio.sleep(0.1)
        return {}

    acts = {"publish": standin("publish", slow)}
    async with running_stack(client, _settings(tmp), replace_activities=acts) as stack:
        handle = await stack.start(CANCEL, id="replay-cancel")
        await asyncio.wait_for(started.wait(), 60)
        await handle.cancel()
        try:
            await handle.result()
        except WorkflowFailureError:
            pass
    return {"cancel": "replay-cancel"}


async def rec_schedule(client: Client, tmp: Path) -> Saved:
    """A run started by a Temporal Schedule (paused, triggered once)."""
    settings = _settings(tmp)
    pipelines = PipelineClient(client, settings)
    options = ScheduleOptions(intervals=[parse_interval("1h")], paused=True)
    async with running_stack(client, settings):
        schedule = await create_schedule(pipelines, "replay-schedule", SCHEDULED, options)
        try:
            triggered = await trigger_schedule(client, "replay-schedule", wait_seconds=30)
            assert triggered.workflow_id is not None, "the schedule started no run"
            await _ended(client.get_workflow_handle(triggered.workflow_id))
        finally:
            await schedule.delete()
    return {"schedule": triggered.workflow_id}


async def rec_registry(client: Client, tmp: Path) -> Saved:
    """The live worker registry: two processes publish, one expires, one withdraws."""
    settings = _settings(tmp)
    wid = names.worker_registry_workflow_id(settings.task_queue_suffix)

    async def listed() -> set[str]:
        live = await read_registry(
            client, settings.task_queue_suffix, secret=settings.registry_secret
        )
        return {p.identity for p in live.processes} if live is not None else set()

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(client, settings, "a@host", entry("a@host").model_dump(mode="json"), 1)
        await publish_raw(client, settings, "b@host", entry("b@host").model_dump(mode="json"))
        # a's entry expires at the workflow's timer; b withdraws (a process told to stop)
        await wait_until(lambda: _equal(listed(), {"b@host"}), "a@host expired", timeout=30)
        await client.get_workflow_handle(wid).signal(WorkerRegistryWorkflow.withdraw, "b@host")
        await wait_until(lambda: _equal(listed(), set()), "b@host withdrawn", timeout=30)
    return {"registry": wid}


async def rec_tolerated(client: Client, tmp: Path) -> Saved:
    """A for_each with ``tolerated_failures`` passed: chunk 0 fails two items (one
    tolerated) and stops; the pipeline cancels chunk 1, whose held items are
    cancelled in flight; chunk 2 never starts."""
    released = asyncio.Event()

    async def publish(req: dict[str, Any]) -> dict[str, Any]:
        n = int(req["input"]["record"]["n"])
        if n < 2:
            raise fail("not_found", f"item {n} is gone")
        for _ in range(600):  # held until cancelled (seen at a heartbeat) or released
            activity.heartbeat()
            try:
                await asyncio.wait_for(released.wait(), 0.1)
                break
            except TimeoutError:
                continue
        return {"written": True, "duplicate": False}

    pipeline = {
        "name": "replay-tolerated",
        "steps": [
            {
                "id": "each",
                "worker": "publish",
                "for_each": [0, 1, 2, 3, 4, 5],
                "chunk_size": 2,
                "max_parallel": 4,
                "tolerated_failures": 1,
                "input": {"sink": {"file": "replay.jsonl"}, "record": {"n": "${{ item }}"}},
            }
        ],
    }
    acts = {"publish": standin("publish", publish)}
    async with running_stack(client, _settings(tmp), replace_activities=acts) as stack:
        handle = await stack.start(pipeline, id="replay-tolerated")
        try:
            result = await pipeline_result(handle)
        finally:
            released.set()
    step = result.steps["each"]
    if step.error_code != "too_many_failures" or not step.items.get("cancelled"):
        raise RuntimeError(f"not the recorded shape (a chunk cancelled in flight): {step}")
    return {
        "tolerated": "replay-tolerated",
        "tolerated-chunk": "replay-tolerated/each/0",
        "tolerated-chunk-cancelled": "replay-tolerated/each/1",
    }


async def rec_eval(client: Client, tmp: Path) -> Saved:
    """An eval run (EvalWorkflow): four items through the validator's own queue, two
    at a time, one of them refused by the worker's input schema, two of a tenant
    whose rate limit (1 per 2 s) queues one at the limiter (its permit signal)."""
    from aiworker.config.catalog import load_specs
    from aiworker.schemas.evals import EvalCandidate, EvalInput, EvalItem, EvalResult

    rules = tuple(parse_rate_limits("validator:replay-eval=1/2s"))
    settings = _settings(tmp, rate_limits=rules)
    spec = load_specs()[names.VALIDATOR]
    ok = {"data": 1, "schema": {"type": "integer"}}
    inp = EvalInput(
        dataset_sha256="0" * 64,
        items=[
            EvalItem(id="a", input=ok),
            EvalItem(id="b", input={"data": "x", "schema": {"type": "integer"}}),
            EvalItem(id="c", input={"schema": {}, "surprise": True}),
            EvalItem(id="d", input=ok, tenant="replay-eval"),
            EvalItem(id="e", input=ok, tenant="replay-eval"),
        ],
        candidate=EvalCandidate(mode="queue", spec=spec),
        concurrency=2,
        queue_suffix=settings.task_queue_suffix,
    )
    wid = f"replay-eval-{uuid.uuid4().hex[:8]}"
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await client.execute_workflow(
            names.EVAL_WORKFLOW,
            inp,
            id=wid,
            task_queue=settings.queue(names.PIPELINES_QUEUE),
            result_type=EvalResult,
        )
    return {"eval": wid}


async def rec_items_per_task(client: Client, tmp: Path) -> Saved:
    """A for_each with ``items_per_task``: web-scrape items
    three to a task against a loopback site whose page 1 fails its first request
    (one retry round), under a rate limit (each item's permit)."""
    import threading

    from aiworker.activities.tools import scrape_tools

    seen: set[str] = set()
    lock = threading.Lock()

    def page(ex: Exchange) -> None:
        with lock:
            first = ex.path not in seen
            seen.add(ex.path)
        if ex.path == "/p/1" and first:
            return ex.send(500, b"down", None)
        ex.send(200, f"<html><body><h1>{ex.path}</h1></body></html>".encode())

    server = Loopback(page).start()
    rules = tuple(parse_rate_limits("web-scrape:replay-ipt=100000/min"))
    settings = _settings(tmp, rate_limits=rules)
    tools = scrape_tools(settings)
    pipeline = {
        "name": "replay-items-per-task",
        "tenant": "replay-ipt",
        "steps": [
            {
                "id": "each",
                "worker": "web-scrape",
                "for_each": list(range(7)),
                "items_per_task": 3,
                "max_parallel": 6,
                "input": {
                    "url": server.url("/p/") + "${{ item }}",
                    "extraction_spec": {"fields": {"h1": {"selector": "h1"}}},
                    "respect_robots": False,
                },
            }
        ],
    }
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            await _run(stack, pipeline, "replay-items-per-task")
    finally:
        server.stop()
        await tools["fetch_url"].aclose()
    return {
        "items-per-task": "replay-items-per-task",
        "items-per-task-chunk": "replay-items-per-task/each/0",
    }


async def rec_breaker(client: Client, tmp: Path) -> Saved:
    """A shared breaker: opened, its open period over, the half-open probe lease
    granted to one process and refused to another, the probe's success closing
    it, a re-opening, and a lease after it (``breaker-probe-lease``)."""
    import time

    from temporalio.service import RPCError

    from aiworker.activities.breakers import SharedBreakers

    settings = _settings(tmp)
    key = "host:replay.example"
    wid = names.shared_breaker_workflow_id(key, settings.task_queue_suffix)
    handle = client.get_workflow_handle(wid)
    queue = settings.queue(names.PIPELINES_QUEUE)
    a = SharedBreakers(queue, client=client, wait_seconds=10)
    b = SharedBreakers(queue, client=client, wait_seconds=10)

    async def opened(until: float) -> bool:
        try:
            return bool(await handle.query(names.BREAKER_STATE_QUERY, result_type=float) >= until)
        except RPCError:  # not started yet
            return False

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        for round_ in range(2):
            until = time.time() + 1.0
            a.publish(key, until)
            await wait_until(lambda u=until: opened(u), "the opening", timeout=30)  # type: ignore[misc]
            await wait_until(lambda u=until: time.time() > u + 0.2, "the open period's end")  # type: ignore[misc]
            if not hasattr(a, "request_probe"):
                continue  # the code before the probe lease (its older-code history)
            granted = await a.request_probe(key, 30.0)
            refused = await b.request_probe(key, 30.0)
            assert granted is not None and granted.granted, granted
            assert refused is not None and not refused.granted, refused
            if round_ == 0:
                a.publish_closed(key)
                answer = None

                async def closed() -> bool:
                    nonlocal answer
                    answer = await b.request_probe(key, 30.0)
                    return answer is not None and answer.closed

                await wait_until(closed, "the probe's success", timeout=30)
    return {"breaker": wid}


async def rec_lost_usage(client: Client, tmp: Path) -> Saved:
    """A call whose attempts the server timed out, never reported by their worker:
    booked at their maximum (``lost-attempt-usage``; a same-name stand-in)."""
    from support.standins import never_ends

    def beats(attempt: int) -> dict[str, Any] | None:
        usage = {"input_tokens": 30, "output_tokens": 10, "external_calls": 1}
        return {"usage": usage, "attempt": 1, "final": False} if attempt == 1 else None

    pipeline = lost_call_pipeline("replay-lost-usage", 1, retry={"max_attempts": 2})
    act = never_ends(names.LLM_CALL, beats)
    settings = _settings(tmp)
    async with running_stack(client, settings, replace_activities={names.LLM_CALL: act}) as s:
        await _run(s, pipeline, "replay-lost-usage")
    return {"lost-usage": "replay-lost-usage"}


WAIT = {
    "name": "replay-wait",
    "tenant": "acme",
    "steps": [
        {
            "id": "sign",
            "wait": {"schema": {"type": "object", "required": ["by"]}, "timeout_seconds": 600},
        },
        {
            "id": "send",
            "worker": "aggregator",
            "input": {
                "policy": "all",
                "branches": {
                    "token": "${{ steps.sign.token }}",
                    "url": "${{ steps.sign.callback_url }}",
                },
            },
        },
        {
            "id": "each",
            "for_each": [1, 2],
            "on_failure": "continue",
            "wait": {"schema": {"type": "object"}, "timeout_seconds": 600},
        },
        {
            "id": "late",
            "on_failure": "continue",
            "wait": {"schema": {"type": "object"}, "timeout_seconds": 1},
        },
        {
            "id": "after",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {"by": "${{ steps.sign.outputs.by }}"}},
        },
    ],
}


async def rec_wait(client: Client, tmp: Path) -> Saved:
    """Wait steps: a token sent by a parallel step, heartbeat, completion, a repeat
    (refused, not in the history), a for_each of two (completed, failed), a timeout."""
    settings = _settings(tmp, serve_public_url="https://cb.example.com")
    async with running_stack(client, settings) as stack:
        handle = await stack.start(WAIT, id="replay-wait")

        async def tokens() -> dict[str, Any] | None:
            p = await handle.query(names.PROGRESS_QUERY, True)
            waiting = {(w["step"], w.get("item")) for w in p["awaiting_callback"]}
            if p["steps"]["send"]["status"] != "succeeded" or len(waiting) < 3:
                return None
            found: dict[str, Any] = p["steps"]["send"]["outputs"]["result"]
            return found

        sent = await wait_until(tokens, "the tokens to be handed out")
        pipelines = PipelineClient(client, settings)
        await pipelines.heartbeat_callback(sent["token"], 900)
        await pipelines.complete_callback(sent["token"], {"by": "ann"})
        await pipelines.complete_callback(sent["token"], {"by": "ann"})  # a repeat
        each = await handle.query(names.CALLBACK_QUERY, sent["token"])
        assert each["state"] == "completed", each
        # the for_each's tokens are read from the workflow's own record of them
        history = await handle.fetch_history()
        secrets = _granted_secrets(history.to_json_dict())
        item_tokens = [make_token("replay-wait", s) for s in secrets[1]]
        await pipelines.complete_callback(item_tokens[0], {"ok": True})
        await pipelines.fail_callback(item_tokens[1], "declined")
        await _ended(handle)
        # escalated: failed, retried in review (the same token waits again), completed
        sign = {**WAIT["steps"][0], "on_failure": "escalate"}
        escalated = {"name": "replay-wait-review", "tenant": "acme", "steps": [sign]}
        review = await stack.start(escalated, id="replay-wait-review")
        grant: list[list[str]] = []

        async def granted() -> bool:
            grant[:] = _granted_secrets((await review.fetch_history()).to_json_dict())
            return bool(grant)

        await wait_until(granted, "the token")
        token = make_token("replay-wait-review", grant[0][0])
        await pipelines.fail_callback(token, "away")

        async def awaiting() -> bool:
            return bool((await review.query(names.PROGRESS_QUERY))["awaiting_review"])

        await wait_until(awaiting, "review")
        await pipelines.send_review("replay-wait-review", "retry", reviewer="r")
        await pipelines.complete_callback(token, {"by": "ann"})
        await _ended(review)
    return {"wait": "replay-wait", "wait-review": "replay-wait-review"}


def _granted_secrets(history: dict[str, Any]) -> list[list[str]]:
    """The secrets each ``callback-tokens`` local activity granted, in order."""
    out = []
    for event in history["events"]:
        marker = event.get("markerRecordedEventAttributes") or {}
        details = marker.get("details") or {}
        if "data" not in details or "result" not in details:
            continue
        data = json.loads(base64.b64decode(details["data"]["payloads"][0]["data"]))
        if data.get("activity_type") != names.CALLBACK_TOKENS:
            continue
        result = json.loads(base64.b64decode(details["result"]["payloads"][0]["data"]))
        out.append(result["secrets"])
    return out


async def _equal(found: Awaitable[set[str]], want: set[str]) -> bool:
    return await found == want


async def rec_flow(client: Client, tmp: Path) -> Saved:
    """The keyed flow workflow (``PipelineFlowWorkflow``), one per mode: a debounce
    collecting three starts and starting the run after its quiet second; singleton
    ``wait`` queueing a start behind a held run and starting it once that run ended;
    a batch full at two starts and the next started at its deadline; a throttle of one
    start per two seconds queueing the second."""
    from test_flow_workflow import held, pipeline, token_of

    from aiworker.workers.client.flow_start import FlowHandle, wait_started

    settings = _settings(tmp)
    pc = PipelineClient(client, settings)
    saved: Saved = {}

    async def run_all(handles: list[Any]) -> None:
        for h in handles:
            assert isinstance(h, FlowHandle)
            await asyncio.wait_for(wait_started(h, poll_seconds=0.05), 30)
            await _ended(h)

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        debounce = {"debounce": {"seconds": 1, "inputs": "all"}}
        handles = [await pc.start(pipeline("replay-flow-debounce", debounce, n)) for n in range(3)]
        await run_all(handles[:1])
        saved["flow-debounce"] = handles[0].flow.flow_workflow_id

        wait = {"singleton": "wait"}
        a = await pc.start(held("replay-flow-singleton", wait, 0))
        b = await pc.start(held("replay-flow-singleton", wait, 1))
        await pc.complete_callback(await token_of(pc, a), {"by": "ann"})
        await pc.complete_callback(await token_of(pc, b), {"by": "bob"})
        await run_all([a, b])
        saved["flow-singleton"] = a.flow.flow_workflow_id

        batch = {"batch": {"max_items": 2, "max_seconds": 1}}
        handles = [await pc.start(pipeline("replay-flow-batch", batch, n)) for n in range(3)]
        await run_all([handles[0], handles[2]])
        saved["flow-batch"] = handles[0].flow.flow_workflow_id

        throttle = {"throttle": {"max_starts": 1, "period_seconds": 2}}
        handles = [await pc.start(pipeline("replay-flow-throttle", throttle, n)) for n in range(2)]
        await run_all(handles)
        saved["flow-throttle"] = handles[0].flow.flow_workflow_id
    return saved


async def rec_flow_scheduled(client: Client, tmp: Path) -> Saved:
    """A schedule's start of a flow pipeline (``ScheduledFlowStart``): its
    ``flow-submit`` activity sends the start through the key's debounce, started
    here as the schedule's action starts it."""
    from test_flow_workflow import pipeline

    from aiworker.workers.client.flow_start import FlowHandle, wait_started
    from aiworker.workflows.flow import ScheduledFlowStartWorkflow

    settings = _settings(tmp)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        raw = pipeline("replay-flow-scheduled", {"debounce": {"seconds": 1}}, 0)
        wid = "replay-flow-scheduled-2026-11-28T00:00:00Z"
        answer = await client.execute_workflow(
            ScheduledFlowStartWorkflow.run,
            raw,
            id=wid,
            task_queue=settings.queue(names.PIPELINES_QUEUE),
        )
        run = FlowHandle(client, answer, "c1")
        await asyncio.wait_for(wait_started(run, poll_seconds=0.05), 30)
        await _ended(run)
    return {"flow-scheduled": wid}


RECORDINGS: dict[str, Recording] = {
    "basic": rec_basic,
    "review": rec_review,
    "redrive": rec_redrive,
    "tree": rec_tree,
    "items": rec_items,
    "agent": rec_agent,
    "agent-limited": rec_agent_limited,
    "agent-mcp": rec_agent_mcp,
    "cancel": rec_cancel,
    "schedule": rec_schedule,
    "registry": rec_registry,
    "limiter": rec_limiter,
    "items-per-task": rec_items_per_task,
    "tolerated": rec_tolerated,
    "breaker": rec_breaker,
    "lost-usage": rec_lost_usage,
    "wait": rec_wait,
    "flow": rec_flow,
    "flow-scheduled": rec_flow_scheduled,
    "eval": rec_eval,
}


async def record(client: Client, only: list[str], out: Path = OUT) -> None:
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    for name in only:
        with tempfile.TemporaryDirectory() as tmp:
            saved = await RECORDINGS[name](client, Path(tmp))
        for file, wid in saved.items():
            history = await client.get_workflow_handle(wid).fetch_history()
            (out / f"{file}.json").write_text(history.to_json() + "\n", "utf-8")
            print(f"{name}: wrote {file}.json ({wid}, {len(history.events)} events)", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="*", help=f"any of {', '.join(RECORDINGS)}")
    parser.add_argument("--list", action="store_true", help="list the recordings and exit")
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help=f"where to write (default {OUT.relative_to(HERE.parent.parent)})",
    )
    args = parser.parse_args()
    if args.list:
        for name, fn in RECORDINGS.items():
            print(f"{name:<9} {(fn.__doc__ or '').strip()}")
        return
    unknown = [n for n in args.recordings if n not in RECORDINGS]
    if unknown:
        parser.error(f"unknown recordings {unknown}; known: {', '.join(RECORDINGS)}")
    env = await WorkflowEnvironment.start_local(
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=local_server_extra_args(),
    )
    try:
        await record(env.client, args.recordings or list(RECORDINGS), args.out)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
