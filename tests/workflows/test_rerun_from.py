"""``aiworker redrive ID --from STEP``: rerun a chosen step and what depends on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import running_stack
from support.history import called_workers
from support.standins import standin
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.workers.client.client import RedriveError, redrive


async def test_rerun_from_a_middle_step_keeps_upstream_and_idempotency_keys(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []

    async def agg(req: dict[str, Any]) -> dict[str, Any]:
        return {"policy": "all", "result": {"n": len(calls)}, "used": [], "failed": []}

    sink = {"file": "rerun.jsonl"}
    pipeline = {
        "name": "rerun",
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
    acts = {"aggregator": standin("aggregator", agg, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        first = await stack.start(pipeline)
        done = await first.result()
        with pytest.raises(RedriveError, match="no top-level step"):
            await redrive(client, settings, first.id, from_step="nope")
        handle = await redrive(client, settings, first.id, from_step="check")
        result = await handle.result()
    assert done.status == "succeeded"
    assert result.status == "succeeded"
    assert result.steps["pub"].reused_from == first.id
    assert result.steps["check"].reused_from is None
    assert result.steps["final"].reused_from is None
    # upstream `pub` was not called again; `check` and `final` were
    assert await called_workers(handle) == ["aggregator", "publish"]
    assert len(calls) == 2
    text = (settings.data_dir / "sinks" / "default" / "rerun.jsonl").read_text()
    keys = [json.loads(x)["idempotency_key"] for x in text.splitlines()]
    # the rerun of `final` keeps the first run's idempotency key
    assert keys[-1] == f"{first.id}/final"
    assert keys.count(f"{first.id}/pub") == 1
