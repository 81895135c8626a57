"""Record workflow histories for the replay test (``test_replay.py``).

Run from the repository root after a deliberate, versioned change to the
workflows (never to make a failing replay test pass by accident)::

    .venv/bin/python tests/workflows/record_histories.py

It starts a local dev server, runs a few pipelines that cover the workflow's
paths (DAG with gate and aggregation, for_each with child workflows, a
validation loop with fallback, budget refusal, human review, cancellation)
and writes each history as JSON under ``tests/workflows/histories/``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent.parent)]

from conftest import running_stack  # noqa: E402
from support.standins import fail, standin  # noqa: E402
from support.waiting import wait_until  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from aiworker.schemas import names  # noqa: E402
from aiworker.schemas.settings import Settings  # noqa: E402
from aiworker.workers.devserver import local_server_extra_args, temporal_cli_path  # noqa: E402
from aiworker.workers.temporal_client import data_converter  # noqa: E402

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


async def _save(handle: WorkflowHandle[Any, Any], name: str) -> None:
    history = await handle.fetch_history()
    (OUT / f"{name}.json").write_text(history.to_json(), "utf-8")
    print(f"wrote {name}.json ({len(history.events)} events)")


async def record(client: Client, data_dir: Path) -> None:
    settings = Settings(
        data_dir=data_dir,
        task_queue_suffix=f"-rec{uuid.uuid4().hex[:6]}",
        metrics_port=0,
        allow_private_networks=True,
        shutdown_grace_seconds=2,
    )
    calls: list[dict[str, Any]] = []

    async def draft(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 1:
            raise fail("invalid_output", "garbage")
        return {"policy": "all", "result": {"ok": True}, "used": [], "failed": []}

    OUT.mkdir(exist_ok=True)
    async with running_stack(client, settings) as stack:
        for name, pipeline in (("dag", DAG), ("foreach", FOR_EACH), ("loop", LOOP)):
            handle = await stack.start(pipeline, id=f"replay-{name}")
            await handle.result()
            await _save(handle, name)
            if name == "foreach":
                await _save(client.get_workflow_handle("replay-foreach/each/0"), "foreach-chunk")
    acts = {"aggregator": standin("aggregator", draft, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(REVIEW, id="replay-review")

        async def awaiting() -> bool:
            p = await handle.query(names.PROGRESS_QUERY)
            return bool(p["awaiting_review"])

        await wait_until(awaiting, "review")
        await handle.execute_update(names.REVIEW_UPDATE, {"decision": "retry", "reviewer": "r"})
        await handle.result()
        await _save(handle, "review")


async def main() -> None:
    keep = local_server_extra_args()
    env = await WorkflowEnvironment.start_local(
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=keep,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await record(env.client, Path(tmp))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
