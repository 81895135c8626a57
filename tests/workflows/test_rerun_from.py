"""``aiworker redrive ID --from STEP``: rerun a chosen step and what depends on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import running_stack
from support.history import called_workers
from support.standins import standin
from temporalio.client import Client
from test_redrive import publish_check_publish

from aiworker.config.settings import Settings
from aiworker.workers.client.client import PipelineClient, RedriveError, redrive


async def test_rerun_from_a_middle_step_keeps_upstream_and_idempotency_keys(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []

    async def agg(req: dict[str, Any]) -> dict[str, Any]:
        return {"policy": "all", "result": {"n": len(calls)}, "used": [], "failed": []}

    pipeline = publish_check_publish("rerun")
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


async def test_rerun_with_a_corrected_input_and_new_idempotency_keys(
    client: Client, settings: Settings
) -> None:
    sink = {"file": "fixed.jsonl"}
    pipeline = {
        "name": "fixed",
        "steps": [
            {"id": "pub", "worker": "publish", "input": {"sink": sink, "record": {"n": 1}}},
            {
                "id": "final",
                "worker": "publish",
                "input": {"sink": sink, "record": {"n": 2}},
                "depends_on": ["pub"],
            },
        ],
    }
    async with running_stack(client, settings) as stack:
        first = await stack.start(pipeline)
        assert (await first.result()).status == "succeeded"
        # a step other than --from, input off the worker's schema, not an object: refused
        with pytest.raises(RedriveError, match="only the --from step"):
            await redrive(client, settings, first.id, "final", inputs={"pub": {}})
        with pytest.raises(RedriveError, match=r"--input final: .*final.*sink"):
            bad = {"sink": 5, "record": {"n": 3}}
            await redrive(client, settings, first.id, "final", inputs={"final": bad})
        with pytest.raises(RedriveError, match="must be a JSON object"):
            await redrive(client, settings, first.id, "final", inputs={"final": [1]})
        good = {"sink": sink, "record": {"n": 3}}
        handle = await redrive(
            client, settings, first.id, "final", inputs={"final": good}, new_idempotency_keys=True
        )
        result = await handle.result()
    # nothing was started by the refused ones: this is the first redrive
    assert handle.id == f"{first.id}-redrive-1"
    assert result.status == "succeeded"
    assert result.steps["pub"].reused_from == first.id
    lines = [
        json.loads(x)
        for x in (settings.data_dir / "sinks" / "default" / "fixed.jsonl").read_text().splitlines()
    ]
    assert [x["record"] for x in lines] == [{"n": 1}, {"n": 2}, {"n": 3}]
    # the rerun step's key is under the new run's id, so its effect happened again
    assert lines[-1]["idempotency_key"] == f"{handle.id}/final"


async def test_recorded_specs_come_from_the_run_config(client: Client, settings: Settings) -> None:
    pipeline = {
        "name": "specs",
        "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    async with running_stack(client, settings) as stack:
        first = await stack.start(pipeline)
        await first.result()
        pipelines = PipelineClient(client, settings)
        live = await pipelines.worker_view()
        specs = await pipelines.recorded_specs(first.id)
    # the run recorded the spec of the one worker it names, not the live list
    assert set(specs) == {"validator"}
    assert len(live.specs) > 1
    assert live.specs["validator"].input_schema == specs["validator"].input_schema
