"""The bundled demo pipeline (``make demo``) runs green on the real workers."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import running_stack
from temporalio.client import Client

from schemas.settings import Settings

DEMO = Path(__file__).parents[2] / "workers" / "samples" / "demo.json"


async def test_demo_fans_out_validates_aggregates_and_publishes(
    client: Client, settings: Settings
) -> None:
    pipeline = json.loads(DEMO.read_text("utf-8"))
    async with running_stack(client, settings) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    assert result.status == "succeeded", result.model_dump_json(indent=1)
    assert [p["url"].rsplit("/", 1)[1] for p in result.output["products"]] == [
        "espresso",
        "grinder",
        "kettle",
    ]
    assert result.output["validated"] == 3
    assert result.output["merge_warnings"][0]["code"] == "duplicate_differs"
    assert result.output["published"]["published"] is True
    sink = settings.data_dir / "sinks" / "demo" / "catalog.jsonl"
    (line,) = sink.read_text("utf-8").splitlines()
    assert json.loads(line)["idempotency_key"] == f"{handle.id}/publish"
