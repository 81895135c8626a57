"""Lineage names the step that wrote an artifact, wherever the call ran.

The request carries its ``step_id``: a for_each item, run by a child workflow
whose id is not the pipeline's, is recorded under its step, not under its
idempotency key (which is ``<pipeline id>/<step>/<item>``, so parsing it
against the running workflow's id failed for every child).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio.client import Client
from test_demo_pipeline import run_demo

from aiworker.config.settings import Settings
from aiworker.workers.cli.main import main
from aiworker.workers.process.resources import lineage_index


async def test_for_each_items_are_recorded_under_their_step(
    client: Client,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    handle, result = await run_demo(client, settings)
    children = [
        e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
        async for e in handle.fetch_history_events()
        if e.HasField("child_workflow_execution_started_event_attributes")
    ]
    assert result.status == "succeeded", result.model_dump_json(indent=1)
    assert children, "the for_each step ran no child workflow"
    index = lineage_index(settings)
    top = await index.records(handle.id)
    assert sorted(r.step_id or "" for r in top) == ["guide", "partner", "shop"]
    items = [r for child in children for r in await index.records(child)]
    assert len(items) == 3  # one page per catalog entry
    assert {r.step_id for r in items} == {"pages"}
    assert {r.workflow_id for r in items} == set(children)
    assert all(
        r.idempotency_key and r.idempotency_key.startswith(f"{handle.id}/pages/") for r in items
    )
    # `aiworker artifacts <pipeline id>` lists the items too, each with its index
    monkeypatch.setenv("AIWORKER_DATA_DIR", str(settings.data_dir))
    monkeypatch.delenv("AIWORKER_ARTIFACT_STORE", raising=False)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["artifacts", handle.id, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    steps = sorted(r["step_id"] for r in listed)
    assert steps == ["guide", "pages", "pages", "pages", "partner", "shop"]
    assert await asyncio.to_thread(main, ["artifacts", handle.id]) == 0
    table = capsys.readouterr().out
    assert {f"pages[{i}]" for i in range(3)} <= {line.split()[0] for line in table.splitlines()}
