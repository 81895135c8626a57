"""A large for_each keeps its items' outputs by reference, on a real Temporal server.

Over ``foreach_inline_items`` items the leaf chunks store their items'
outputs in the artifact store; the step's ``outputs.items`` is an
``ItemsRef``; no history of the run (the pipeline's or a chunk's) carries an
item's outputs; references to the list (a later step's input, the pipeline's
output) still see the list; a redrive keeps the succeeded items; a store
that cannot be written fails the items with a stable code instead of losing
them silently; and the recorded run replays.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, running_stack
from support.history import patch_ids
from support.payloads import client_for, stack_settings, workflow_tree
from support.pipelines import pipeline_result
from support.standins import fail, standin
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.errors import AccessDeniedError
from aiworker.activities.items import INDEX_KIND, load_items
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import ITEMS_REF_KIND, ItemsRef, StepResult
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.items import needs_items
from aiworker.workflows.pipeline import PipelineWorkflow

# every item's outputs carry this, so a history holding one would show it
TOKEN = "outputs-token-7f3a"


def _pipeline(n: int, chunk_size: int = 4, tenant: str = "acme") -> dict[str, Any]:
    return {
        "name": "fe-ref",
        "tenant": tenant,
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "chunk_size": chunk_size,
                "max_parallel": chunk_size,
                "input": {"data": "${{ item }}", "schema": {}},
            },
            {
                "id": "after",
                "worker": "validator",
                "depends_on": ["each"],
                "input": {
                    "data": "${{ steps.each.outputs.items }}",
                    "schema": {"type": "array", "minItems": n, "maxItems": n},
                    "gate": True,
                },
            },
        ],
        "output": {
            "items": "${{ steps.each.outputs.items }}",
            "third": "${{ steps.each.outputs.items[2].n }}",
            "failed": "${{ steps.each.outputs.failed }}",
            "after": "${{ steps.after.outputs.valid }}",
        },
    }


def _echo(broken: dict[str, bool]) -> Any:
    async def echo(req: dict[str, Any]) -> dict[str, Any]:
        data = req["input"]["data"]
        if isinstance(data, int) and broken["on"] and data % 5 == 0:
            raise fail("validation_failed", f"item {data} is broken this time")
        if isinstance(data, list):  # the `after` step: the validator's own verdict
            return {"valid": True, "errors": []}
        return {"n": data, "tag": TOKEN}

    return standin("validator", echo)


def _echo_stack(
    env: WorkflowEnvironment, settings: Settings, broken: dict[str, bool]
) -> AbstractAsyncContextManager[Stack]:
    """A running stack whose validator is the echo stand-in."""
    client = client_for(env, settings)
    return running_stack(client, settings, replace_activities={"validator": _echo(broken)})


def _expected(n: int, broken: bool) -> list[Any]:
    return [None if broken and i % 5 == 0 else {"n": i, "tag": TOKEN} for i in range(n)]


async def test_outputs_go_by_reference_and_references_still_see_the_list(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, foreach_inline_items=5)
    broken = {"on": True}
    async with _echo_stack(env, settings, broken) as s:
        handle = await s.start(_pipeline(12))
        result = await handle.result()
        small = await (await s.start(_pipeline(5))).result()
        histories = await workflow_tree(s.client, handle.id)

    each = result.steps["each"]
    ref = ItemsRef.of(each.outputs["items"])
    assert ref is not None and each.outputs["items"]["kind"] == ITEMS_REF_KIND
    assert ref.count == 12
    # one part per leaf chunk of 4 items, each holding that chunk's succeeded items
    assert len(ref.parts) == 3
    store = FileArtifactStore(settings.data_dir)
    assert await load_items(store, "acme", ref) == _expected(12, True)
    # the counts and the failed items as before
    assert each.status == "partial"
    assert each.items == {"total": 12, "succeeded": 9, "failed": 3}
    assert [e["index"] for e in each.outputs["errors"]] == [0, 5, 10]
    assert {e["error_code"] for e in each.outputs["errors"]} == {"validation_failed"}
    # references see the list: the next step's input, the output, a path into it
    assert result.output["items"] == _expected(12, True)
    assert result.output["third"] == 2
    assert result.output["failed"] == 3
    assert result.output["after"] is True
    # at or under the threshold nothing changes: the list is inline
    assert small.steps["each"].outputs["items"] == _expected(5, True)

    # What each leaf chunk returned to the pipeline: its failed items, the count
    # of the others and its part's reference, never an item's outputs (so small
    # that it stays inline in the history, under the 1 KiB spill threshold).
    assert len(histories) == 1 + 3
    for wid, history in histories.items():
        if wid == handle.id:
            continue
        done = history.events[-1].workflow_execution_completed_event_attributes
        (payload,) = done.result.payloads
        assert not payload.external_payloads, wid
        returned = json.loads(payload.data)
        assert TOKEN not in payload.data.decode()
        assert len(returned["parts"]) == 1
        assert returned["succeeded"] + len(returned["items"]) == 4
        assert all(it["status"] == "failed" for it in returned["items"])
    parent = histories[handle.id]
    assert patch_ids(list(parent.events)) == set()  # pinned: one way to run, no patch

    # The recorded run replays (its chunk payloads read back from the store).
    replayer = Replayer(
        workflows=[PipelineWorkflow, PipelineForEachWorkflow],
        data_converter=data_converter(settings),
    )
    for history in histories.values():
        replayed = await replayer.replay_workflow(history)
        assert replayed.replay_failure is None


async def test_a_redrive_keeps_the_stored_items_and_runs_the_failed_ones(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, foreach_inline_items=5)
    broken = {"on": True}
    async with _echo_stack(env, settings, broken) as s:
        first = await s.start(_pipeline(12))
        partial = await first.result()
        broken["on"] = False
        handle = await PipelineClient(s.client, settings).redrive(first.id)
        result = await handle.result()

    assert partial.status == "partial"
    assert result.status == "succeeded"
    assert result.redrive["items_rerun"] == {"each": [0, 5, 10]}
    each = result.steps["each"]
    assert each.items == {"total": 12, "succeeded": 12, "failed": 0, "reused": 9}
    ref = ItemsRef.of(each.outputs["items"])
    assert ref is not None
    old = ItemsRef.of(partial.steps["each"].outputs["items"])
    assert old is not None
    # the earlier run's parts first, then one part: the three items run again fit one chunk
    assert ref.parts[: len(old.parts)] == old.parts
    assert len(ref.parts) == len(old.parts) + 1
    assert result.output["items"] == _expected(12, False)


async def test_a_store_that_cannot_be_written_fails_the_items_with_a_code(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, foreach_inline_items=2)
    # a file where the tenant's artifact directory must go: every put fails (a real
    # OSError from the file store, on every attempt)
    (settings.data_dir / "artifacts").mkdir(parents=True)
    (settings.data_dir / "artifacts" / "acme").write_text("not a directory")
    broken = {"on": False}
    async with _echo_stack(env, settings, broken) as s:
        result = await pipeline_result(await s.start(_pipeline(4, chunk_size=4)))

    each = result.steps["each"]
    assert each.status == "failed"
    assert each.items == {"total": 4, "succeeded": 0, "failed": 4}
    assert each.error_code == "internal"
    assert "could not be stored" in each.outputs["errors"][0]["message"]
    assert result.status == "failed"


async def test_a_tree_of_chunks_hands_up_one_index_part_per_group(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # 100 items in chunks of 2: 50 leaf chunks, more than one workflow's FANOUT
    # children, so the pipeline starts 25 groups of 2 leaves; each group stores
    # its leaves' parts as one index part.
    settings = stack_settings(tmp_path, foreach_inline_items=5)
    broken = {"on": True}
    async with _echo_stack(env, settings, broken) as s:
        result = await (await s.start(_pipeline(100, chunk_size=2))).result()

    ref = ItemsRef.of(result.steps["each"].outputs["items"])
    assert ref is not None and ref.count == 100
    assert len(ref.parts) == 25
    store = FileArtifactStore(settings.data_dir)
    index = json.loads(await store.get("acme", ref.parts[0]))
    assert index["kind"] == INDEX_KIND and len(index["parts"]) == 2
    assert await load_items(store, "acme", ref) == _expected(100, True)
    assert result.output["items"] == _expected(100, True)
    assert result.steps["each"].items == {"total": 100, "succeeded": 80, "failed": 20}
    # another tenant cannot read them, whatever the reference says
    with pytest.raises(AccessDeniedError):
        await load_items(store, "other", ref)


def test_only_references_that_read_a_for_each_list_held_by_reference_load_it() -> None:
    ref = {"kind": ITEMS_REF_KIND, "count": 2, "parts": []}
    counts = {"total": 2, "succeeded": 2, "failed": 0}
    steps = {
        "each": StepResult(status="succeeded", outputs={"items": ref, "count": 2}, items=counts),
        # a worker whose outputs look like a reference is not a for_each: its value as it is
        "lookalike": StepResult(status="succeeded", outputs={"items": ref}),
        # a for_each whose items hold something the engine did not write
        "odd": StepResult(
            status="succeeded", outputs={"items": {"kind": ITEMS_REF_KIND}}, items=counts
        ),
    }

    def needed(*values: Any) -> list[str]:
        return [sid for sid, _ in needs_items(list(values), steps)]

    assert needed("${{ steps.each.outputs.items }}") == ["each"]
    assert needed({"x": ["${{ steps.each.outputs.items[1].n }}"]}) == ["each"]
    assert needed("${{ steps.each.outputs }}") == ["each"]
    assert needed("${{ steps.each.outputs.count }}", "${{ steps.each.status }}") == []
    assert needed("${{ steps.lookalike.outputs.items }}", "${{ steps.odd.outputs.items }}") == []
    assert needed(None, "no references") == []
