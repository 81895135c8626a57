"""The bundled demo pipeline (``make demo``) runs green on the real workers
against the bundled sample site served on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import running_stack
from temporalio.client import Client, WorkflowHandle

from aiworker.config.settings import Settings
from aiworker.workers.devstack.demo_site import DemoSite
from aiworker.workers.process.resources import build_tools

DEMO = Path(__file__).parents[2] / "workers" / "samples" / "demo.json"


async def run_demo(client: Client, settings: Settings) -> tuple[WorkflowHandle[Any, Any], Any]:
    """Run the bundled demo pipeline on the real workers against the sample site."""
    pipeline = json.loads(DEMO.read_text("utf-8"))
    site = DemoSite().start()
    pipeline["inputs"]["site_url"] = site.url
    tools = build_tools(settings)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            handle = await stack.start(pipeline)
            result = await handle.result()
    finally:
        site.stop()
        await tools["fetch_url"].aclose()
    return handle, result


async def test_demo_scrapes_validates_aggregates_and_publishes(
    client: Client, settings: Settings
) -> None:
    handle, result = await run_demo(client, settings)
    assert result.status == "succeeded", result.model_dump_json(indent=1)
    assert [p["link"].rsplit("/", 1)[1] for p in result.output["catalog"]] == [
        "espresso.html",
        "grinder.html",
        "kettle.html",
    ]
    assert result.output["pages_scraped"] == 3
    assert result.output["valid"] is True
    assert result.output["summary_status"] == "skipped"
    assert result.output["catalog_warnings"][0]["code"] == "duplicate_differs"
    assert result.output["published"]["published"] is True
    # the guide's main text, read as an article (what the summary step is given)
    assert result.output["guide"] == "Brewing pour-over coffee at home"
    guide = result.steps["guide"].outputs["data"]["content"]
    assert "gooseneck kettle" in guide["markdown"] and "## What you need" in guide["markdown"]
    assert "Subscribe" not in guide["text"] and "Great tips" not in guide["text"]
    assert result.usage.external_calls == 6
    sink = settings.data_dir / "sinks" / "demo" / "catalog.jsonl"
    (line,) = sink.read_text("utf-8").splitlines()
    assert json.loads(line)["idempotency_key"] == f"{handle.id}/publish"
