"""Redrive (run a failed pipeline again, reusing what succeeded) and listing
pipelines through visibility queries on the search attributes."""

from __future__ import annotations

import json
import uuid
from typing import Any

from conftest import running_stack
from support.history import scheduled_activities
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.schemas.settings import Settings
from aiworker.workers.client import list_pipelines, list_query, redrive


async def test_redrive_reuses_succeeded_steps_and_keeps_idempotency_keys(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []

    async def flaky(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 1:
            raise fail("not_found", "the upstream page is gone (this time)")
        return {"policy": "all", "result": {"ok": True}, "used": [], "failed": []}

    sink = {"file": "redrive.jsonl"}
    pipeline = {
        "name": "redrive",
        "steps": [
            {"id": "pub", "worker": "publish", "input": {"sink": sink, "record": {"n": 1}}},
            {
                "id": "check",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "depends_on": ["pub"],
            },
            {
                "id": "final",
                "worker": "publish",
                "input": {"sink": sink, "record": "${{ steps.check.outputs.result }}"},
            },
        ],
    }
    acts = {"aggregator": standin("aggregator", flaky, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        first = await stack.start(pipeline)
        failed = await first.result()
        handle = await redrive(client, settings, first.id)
        result = await handle.result()
        desc = await handle.describe()
    assert failed.status == "failed"
    assert failed.steps["check"].error_code == "not_found"
    assert failed.steps["final"].status == "skipped"
    assert result.status == "succeeded"
    assert result.steps["pub"].reused_from == first.id
    assert result.steps["check"].reused_from is None
    assert await scheduled_activities(handle) == ["aggregator", "publish"]
    assert (await desc.memo())["reused_steps"] == ["pub"]
    text = (settings.data_dir / "sinks" / "default" / "redrive.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    assert [x["idempotency_key"] for x in lines] == [f"{first.id}/pub", f"{first.id}/final"]


async def test_list_filters_by_status_and_tenant(client: Client, settings: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ok = {
        "name": "listed",
        "tenant": tenant,
        "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    bad = {**ok, "steps": [{**ok["steps"][0], "input": {"data": 1, "schema": {"not": {}}}}]}
    blocked = {
        **ok,
        "steps": [
            bad["steps"][0],
            {
                "id": "p",
                "worker": "publish",
                "gate": "v",
                "input": {"sink": {"file": "l"}, "record": 1},
            },
        ],
    }
    async with running_stack(client, settings) as stack:
        h1 = await stack.start(ok)
        h2 = await stack.start(blocked)
        await h1.result()
        await h2.result()

    async def both_visible() -> bool:
        rows = await list_pipelines(client, tenant=tenant)
        return {r["status"] for r in rows} == {"succeeded", "partial"}

    await wait_until(both_visible, "visibility to show both pipelines")
    rows = await list_pipelines(client, tenant=tenant, status="partial")
    assert [r["workflow_id"] for r in rows] == [h2.id]
    assert rows[0]["pipeline"] == "listed" and rows[0]["tenant"] == tenant
    assert list_query("a'b") == "WorkflowType = 'PipelineWorkflow' AND AiworkerStatus = 'a\\'b'"
