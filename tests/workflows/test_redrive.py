"""Redrive (run a failed pipeline again, reusing what succeeded) and listing
pipelines through visibility queries on the search attributes."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from conftest import running_stack
from support.history import called_workers
from support.loopback import Exchange, Loopback, serve
from support.pipelines import pipeline_result
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings
from aiworker.workers.client.client import (
    PipelineClient,
    RedriveError,
    list_pipelines,
    list_query,
    redrive,
)


def publish_check_publish(name: str) -> dict[str, Any]:
    """publish -> aggregator ``check`` -> publish of check's result, into ``<name>.jsonl``."""
    sink = {"file": f"{name}.jsonl"}
    return {
        "name": name,
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


async def test_redrive_reuses_succeeded_steps_and_keeps_idempotency_keys(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []

    async def flaky(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 1:
            raise fail("not_found", "the upstream page is gone (this time)")
        return {"policy": "all", "result": {"ok": True}, "used": [], "failed": []}

    pipeline = publish_check_publish("redrive")
    acts = {"aggregator": standin("aggregator", flaky, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        first = await stack.start(pipeline)
        failed = await pipeline_result(first)
        handle = await redrive(client, settings, first.id)
        result = await handle.result()
        desc = await handle.describe()
    assert failed.status == "failed"
    assert failed.steps["check"].error_code == "not_found"
    assert failed.steps["final"].status == "skipped"
    assert result.status == "succeeded"
    assert result.steps["pub"].reused_from == first.id
    assert result.steps["check"].reused_from is None
    assert await called_workers(handle) == ["aggregator", "publish"]
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


class _FlakySite:
    """Three pages on loopback; ``/p/1`` answers 404 until ``fixed``. Counts hits."""

    def __init__(self) -> None:
        self.fixed = False
        self.hits: Counter[str] = Counter()

    def handle(self, ex: Exchange) -> None:
        if not ex.path.startswith("/p/"):
            ex.send(404, b"")
            return
        self.hits[ex.path] += 1
        if ex.path == "/p/1" and not self.fixed:
            ex.send(404, b"<html><body>gone</body></html>")
            return
        ex.send(200, f"<html><body><h1>page {ex.path[3:]}</h1></body></html>".encode())


def _flaky_pipeline(site: Loopback, tenant: str) -> dict[str, Any]:
    return {
        "name": "redrive-items",
        "tenant": tenant,
        "inputs": {"urls": [site.url(f"/p/{i}") for i in range(3)]},
        "steps": [
            {"id": "side", "worker": "validator", "input": {"data": 1, "schema": {}}},
            {
                "id": "pages",
                "worker": "web-scrape",
                "for_each": "${{ inputs.urls }}",
                "input": {
                    "url": "${{ item }}",
                    "extraction_spec": {"fields": {"t": {"selector": "h1", "required": True}}},
                },
            },
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": "${{ steps.pages.outputs.items }}", "schema": {"type": "array"}},
            },
        ],
        "output": {"titles": "${{ steps.pages.outputs.items }}"},
    }


async def test_redrive_reruns_only_the_failed_items_of_a_partial_for_each(
    client: Client, settings: Settings
) -> None:
    site = _FlakySite()
    tenant = f"rd-{uuid.uuid4().hex[:8]}"  # its own 10/min web-scrape bucket
    tools = scrape_tools(settings)
    with serve(site.handle) as server:
        async with running_stack(client, settings, tools=tools) as stack:
            first = await stack.start(_flaky_pipeline(server, tenant))
            partial = await first.result()
            site.fixed = True
            pipelines = PipelineClient(client, settings)
            handle = await pipelines.redrive(first.id)
            result = await handle.result()
            # the first run is still the one to redrive: the next id counts on
            again = await pipelines.redrive(first.id)
            await again.result()
            # an id taken by hand is skipped
            await stack.start(
                {"name": "x", "steps": _flaky_pipeline(server, tenant)["steps"][:1]},
                id=f"{first.id}-redrive-3",
            )
            fourth = await pipelines.redrive(first.id)
            await fourth.result()
    await tools["fetch_url"].aclose()
    assert partial.status == "partial"
    assert partial.steps["pages"].status == "partial"
    assert partial.steps["pages"].error_code == "not_found"
    assert handle.id == f"{first.id}-redrive-1"
    assert again.id == f"{first.id}-redrive-2"
    assert fourth.id == f"{first.id}-redrive-4"
    assert result.status == "succeeded"
    assert result.redrive == {
        "from": first.id,
        "reused": ["side"],
        "rerun": ["pages", "check"],
        "items_rerun": {"pages": [1]},
    }
    assert result.steps["side"].reused_from == first.id
    assert result.steps["pages"].items == {"total": 3, "succeeded": 3, "failed": 0, "reused": 2}
    assert [x["data"]["t"] for x in result.output["titles"]] == ["page 0", "page 1", "page 2"]
    # the items that had succeeded were not fetched again, by either redrive
    assert site.hits == {"/p/0": 1, "/p/1": 4, "/p/2": 1}


async def test_redrive_of_a_pipeline_that_is_not_there_or_not_a_pipeline(
    client: Client, settings: Settings
) -> None:
    pipelines = PipelineClient(client, settings)
    with pytest.raises(RPCError) as missing:
        await pipelines.redrive(f"nope-{uuid.uuid4().hex[:8]}")
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    other = await client.start_workflow(
        "NotAPipeline", id=f"other-{uuid.uuid4().hex[:8]}", task_queue="nobody-polls"
    )
    await other.terminate()
    with pytest.raises(RedriveError, match="is a NotAPipeline workflow, not a pipeline"):
        await pipelines.redrive(other.id)
