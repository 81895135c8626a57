"""``aiworker eval dataset`` collects for_each items and local-activity calls too,
on the real dev server: a pipeline with a step's own validator call, a for_each
whose items are one activity each, and a for_each whose items run two to an
items task, recorded once with local activities on (the validator's calls are
markers in the pipeline's and the chunks' histories) and once off (activities).
Either way the dataset has one item per call, each with its resolved input, its
output and, for an item, its index; the same query writes the same bytes."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support import history
from support.payloads import stack_settings
from support.procs import run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.client import Client

INT = {"type": "integer"}


def pipeline(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "inputs": {"n": 3, "xs": [1, "two", 3], "ys": [4, "five", 6]},
        "steps": [
            {
                "id": "one",
                "worker": "validator",
                "input": {"data": "${{ inputs.n }}", "schema": INT},
            },
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.xs }}",
                "input": {"data": "${{ item }}", "schema": INT},
            },
            {
                "id": "pairs",
                "worker": "validator",
                "for_each": "${{ inputs.ys }}",
                "items_per_task": 2,
                "input": {"data": "${{ item }}", "schema": INT},
            },
        ],
    }


@pytest.mark.parametrize("local", [True, False], ids=["local", "activities"])
async def test_for_each_items_and_local_calls_are_dataset_items(
    client: Client, tmp_path: Path, local: bool
) -> None:
    s = stack_settings(tmp_path, local_activities=local)
    name = f"items-{uuid.uuid4().hex[:8]}"
    async with running_stack(client, s) as stack:
        handle = await stack.start(pipeline(name))
        assert (await handle.result()).status == "succeeded"
    # the calls ran as the setting says: markers, or activities
    ran_local = await history.local_activities(handle)
    assert (ran_local == ["validator"]) is local, ran_local
    env = worker_env(client, s, s.data_dir)
    ds = tmp_path / "ds.jsonl"
    argv = ["eval", "dataset", "--worker", "validator", "--pipeline", name, "-o", str(ds)]

    async def seven() -> bool:
        done = await asyncio.to_thread(run_cli_module, argv, env)
        assert done.returncode in (0, 3), done.stderr
        return done.returncode == 0 and len(ds.read_bytes().splitlines()) == 8

    await wait_until(seven, "the run in visibility", timeout=60, interval=0.5)
    first = ds.read_bytes()
    header, *lines = first.splitlines()
    assert json.loads(header)["items"] == 7
    items = [json.loads(line) for line in lines]
    by_step: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_step.setdefault(item["step_id"], []).append(item)
    assert sorted(by_step) == ["each", "one", "pairs"]
    (one,) = by_step["one"]
    assert one["input"] == {"data": 3, "schema": INT} and one["item_index"] is None
    assert one["output"] == {"valid": True, "errors": []}
    assert one["history_workflow_id"] is None and one["workflow_id"] == handle.id
    inputs = {"each": [1, "two", 3], "pairs": [4, "five", 6]}
    for step, values in inputs.items():
        got = sorted(by_step[step], key=lambda i: i["item_index"])
        assert [i["item_index"] for i in got] == [0, 1, 2]
        assert [i["input"] for i in got] == [{"data": v, "schema": INT} for v in values]
        assert [i["output"]["valid"] for i in got] == [isinstance(v, int) for v in values]
        assert all(i["workflow_id"] == handle.id for i in got)
        assert all(i["history_workflow_id"].startswith(f"{handle.id}/{step}/") for i in got)
    assert [(i["status"], i["version"]) for i in items] == [("succeeded", "1")] * 7
    # markers when local; items tasks are activities either way
    assert {i["local"] for i in by_step["one"] + by_step["each"]} == {local}
    assert len({i["id"] for i in items}) == 7
    # the same query on the same history: the same bytes
    done = await asyncio.to_thread(run_cli_module, argv, env)
    assert done.returncode == 0 and ds.read_bytes() == first, done.stderr
