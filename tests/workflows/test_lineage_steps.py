"""Lineage names the step that wrote an artifact, wherever the call ran.

The request carries its ``step_id``: a for_each item, run by a child workflow
whose id is not the pipeline's, is recorded under its step, not under its
idempotency key (which is ``<pipeline id>/<step>/<item>``, so parsing it
against the running workflow's id failed for every child).
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import running_stack
from temporalio.client import Client

from aiworker.schemas.settings import Settings
from aiworker.workers.demo_site import DemoSite
from aiworker.workers.resources import build_tools, lineage_index

DEMO = Path(__file__).parents[2] / "workers" / "samples" / "demo.json"


async def test_for_each_items_are_recorded_under_their_step(
    client: Client, settings: Settings
) -> None:
    pipeline = json.loads(DEMO.read_text("utf-8"))
    site = DemoSite().start()
    pipeline["inputs"]["site_url"] = site.url
    tools = build_tools(settings)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            handle = await stack.start(pipeline)
            result = await handle.result()
            children = [
                e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                async for e in handle.fetch_history_events()
                if e.HasField("child_workflow_execution_started_event_attributes")
            ]
    finally:
        site.stop()
        await tools["fetch_url"].aclose()
    assert result.status == "succeeded", result.model_dump_json(indent=1)
    assert children, "the for_each step ran no child workflow"
    index = lineage_index(settings)
    top = await index.records(handle.id)
    assert sorted(r.step_id or "" for r in top) == ["partner", "shop"]
    items = [r for child in children for r in await index.records(child)]
    assert len(items) == 3  # one page per catalog entry
    assert {r.step_id for r in items} == {"pages"}
    assert {r.workflow_id for r in items} == set(children)
    assert all(
        r.idempotency_key and r.idempotency_key.startswith(f"{handle.id}/pages/") for r in items
    )
