"""A for_each step's ``tolerated_failures`` on a real Temporal server (issue #34).

Once more items failed than tolerated, no item starts, the items in flight are
cancelled (their activities: ``ActivityTaskCancelRequested`` in the chunk's
history; a running chunk: a cancellation request) and the step fails
``too_many_failures`` with the counts; at or under the threshold it is ``partial``.
The stand-in ``publish`` fails the chosen items at once, answers the others
at once or holds them until Temporal cancels them (or the test ends).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support.payloads import stack_settings
from support.pipelines import pipeline_result
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import ItemsRef
from aiworker.workers.client.client import redrive
from aiworker.workflows.chunks import FANOUT, leaves

SINK = {"file": "tolerated.jsonl"}


def _pipeline(n: int, tolerated: Any, chunk_size: int, max_parallel: int) -> dict[str, Any]:
    return {
        "name": "tolerated",
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "publish",
                "for_each": "${{ inputs.items }}",
                "chunk_size": chunk_size,
                "max_parallel": max_parallel,
                "tolerated_failures": tolerated,
                "input": {"sink": SINK, "record": {"n": "${{ item }}"}},
            }
        ],
    }


class World:
    """The stand-in's behaviour per item: fail, hold until cancelled, or answer."""

    def __init__(self, failing: set[int], holding: set[int], fail_after: int = 0) -> None:
        self.failing, self.holding = failing, holding
        self.called: list[int] = []
        self.released = asyncio.Event()
        # the failing items fail once this many items were called
        self.fail_after = fail_after
        self.enough = asyncio.Event()

    async def publish(self, req: dict[str, Any]) -> dict[str, Any]:
        n = int(req["input"]["record"]["n"])
        self.called.append(n)
        if len(self.called) >= self.fail_after:
            self.enough.set()
        if n in self.failing:
            await asyncio.wait_for(self.enough.wait(), 60)
            raise fail("not_found", f"item {n} is gone")
        if n in self.holding:
            # held until Temporal cancels the activity (seen at a heartbeat) or the test
            # ends; bounded, so a missed cancellation fails the test, never hangs it
            for _ in range(600):
                activity.heartbeat()
                try:
                    await asyncio.wait_for(self.released.wait(), 0.1)
                    break
                except TimeoutError:
                    continue
        return {"written": True, "duplicate": False}


async def _events(client: Client, wid: str, kind: int) -> int:
    history = await client.get_workflow_handle(wid).fetch_history()
    return sum(e.event_type == kind for e in history.events)


async def _run(
    client: Client, settings: Settings, world: World, pipeline: dict[str, Any]
) -> tuple[Any, str]:
    acts = {"publish": standin("publish", world.publish)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        try:
            result = await asyncio.wait_for(pipeline_result(handle), 120)
        finally:
            world.released.set()
    return result, handle.id


async def test_over_the_count_the_step_stops_and_fails_with_the_counts(
    client: Client, settings: Settings
) -> None:
    # one chunk, 4 items at once: items 0 and 1 fail, every other item is held
    world = World(failing={0, 1}, holding=set(range(2, 20)))
    result, wid = await _run(client, settings, world, _pipeline(20, 1, 20, 4))
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["failed"] == 2 and items["succeeded"] == 0 and items["tolerated"] == 1
    # the held items that had started were cancelled; the rest never started
    assert items["cancelled"] >= 2 and items["cancelled"] + items["not_started"] == 18
    assert items["cancelled"] <= 4
    assert step.outputs["cancelled"] == items["cancelled"]
    assert step.outputs["not_started"] == items["not_started"]
    assert (
        f"2 of 20 items failed, more than the 1 tolerated (tolerated_failures 1): 0 succeeded, "
        f"{items['cancelled']} cancelled, {items['not_started']} not started; item 0: "
    ) in (step.error_message or "")
    assert [e["index"] for e in step.outputs["errors"]] == [0, 1]
    chunk = f"{wid}/each/0"
    scheduled = await _events(client, chunk, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    # started items: the two failed and the cancelled (a worker may not have taken those)
    assert scheduled == 2 + items["cancelled"] >= len(world.called)
    cancels = await _events(client, chunk, EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
    assert cancels == items["cancelled"]
    assert result.status == "failed"


async def test_at_the_threshold_the_step_is_partial(client: Client, settings: Settings) -> None:
    world = World(failing={3, 11}, holding=set())
    result, _ = await _run(client, settings, world, _pipeline(20, 2, 5, 10))
    step = result.steps["each"]
    assert step.status == "partial" and step.error_code == "not_found", step
    assert step.items == {
        "total": 20,
        "succeeded": 18,
        "failed": 2,
        "cancelled": 0,
        "not_started": 0,
        "tolerated": 2,
    }
    assert sorted(world.called) == list(range(20))


async def test_a_share_counts_failures_across_chunks(client: Client, settings: Settings) -> None:
    # "10%" of 20 items tolerates 2. Chunks of 5, two at once: chunk 0 fails item 0,
    # chunk 1 items 5 and 6 (neither chunk alone passes 2); chunks 2 and 3 hold their
    # items: the third failure stops the step as the second of chunks 0, 1 ends.
    world = World(failing={0, 5, 6}, holding=set(range(10, 20)))
    result, wid = await _run(client, settings, world, _pipeline(20, "10%", 5, 10))
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["failed"] == 3 and items["succeeded"] == 7 and items["tolerated"] == 2
    assert items["cancelled"] + items["not_started"] == 10
    assert "(tolerated_failures '10%')" in (step.error_message or "")
    # at most one chunk of held items started (the one chunk 0 or 1 made room for)
    # (a cancelled item's activity may have been cancelled before a worker took it)
    assert len([n for n in world.called if n >= 10]) <= items["cancelled"] <= 5
    started = await _events(
        client, wid, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    )
    assert started in (2, 3)
    assert (
        await _events(
            client, wid, EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
        )
        == started - 2
    )


async def test_a_tree_of_chunks_passes_the_threshold_down(
    client: Client, settings: Settings
) -> None:
    # 70 items in chunks of 2: 35 leaf chunks, more than one workflow's FANOUT (32),
    # so group chunks run them; one leaf at a time. Items 0-5 fail: the first leaf
    # ends with 2 failures (tolerated), the next one's first failure passes the
    # threshold inside its group, which stops; the pipeline starts no group more.
    assert leaves(70, 2) > FANOUT
    world = World(failing=set(range(6)), holding=set())
    result, wid = await _run(client, settings, world, _pipeline(70, 2, 2, 2))
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["failed"] in (3, 4) and items["succeeded"] == 0
    assert items["failed"] + items["cancelled"] + items["not_started"] == 70
    assert items["not_started"] >= 66
    assert items["failed"] <= len(world.called) <= items["failed"] + items["cancelled"]
    # the pipeline started one group chunk: the others never started
    started = await _events(
        client, wid, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    )
    assert started == 1


async def test_a_redrive_runs_the_failed_cancelled_and_unstarted_items_again(
    client: Client, settings: Settings
) -> None:
    # nothing tolerated: item 3 fails once and stops the step; the redrive runs
    # every item that did not succeed (failed, cancelled, never started) and keeps
    # the others
    world = World(failing={3}, holding={2})
    acts = {"publish": standin("publish", world.publish)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        first = await stack.start(_pipeline(10, 0, 10, 2))
        try:
            failed = await asyncio.wait_for(pipeline_result(first), 120)
        finally:
            world.released.set()
        before = failed.steps["each"].items
        assert failed.steps["each"].error_code == "too_many_failures"
        assert before["failed"] == 1 and before["not_started"] >= 6
        world.failing, world.holding, world.called = set(), set(), []
        again = await redrive(client, settings, first.id)
        result = await asyncio.wait_for(again.result(), 120)
    step = result.steps["each"]
    assert result.status == "succeeded" and step.status == "succeeded", step
    assert step.items.get("reused") == before["succeeded"], (before, step.items, world.called)
    assert sorted(world.called) == sorted(set(range(10)) - set(_succeeded(failed)))
    assert step.outputs["succeeded"] == 10


def _succeeded(result: Any) -> list[int]:
    return [i for i, out in enumerate(result.steps["each"].outputs["items"]) if out is not None]


async def test_the_pipeline_cancels_a_running_chunk_which_returns_its_items(
    client: Client, settings: Settings
) -> None:
    # chunks of 2, two at once: chunk 0 fails both items (one tolerated) and stops;
    # chunk 1 holds its items, so the pipeline cancels it: it completes with them
    # (cancelled in flight, or never started if the request came first); chunk 2
    # never starts
    world = World(failing={0, 1}, holding={2, 3, 4, 5})
    result, wid = await _run(client, settings, world, _pipeline(6, 1, 2, 4))
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["failed"] == 2 and items["succeeded"] == 0
    assert items["cancelled"] + items["not_started"] == 4 and items["not_started"] >= 2
    request = EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
    assert await _events(client, wid, request) == 1
    chunk = client.get_workflow_handle(f"{wid}/each/1")
    assert (await chunk.describe()).status == WorkflowExecutionStatus.COMPLETED
    asked = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
    assert await _events(client, chunk.id, asked) == 1
    cancelled = EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    assert await _events(client, chunk.id, cancelled) == items["cancelled"]


async def test_local_activity_items_stop_too(client: Client, settings: Settings) -> None:
    # the validator runs as a local activity; every item fails its gate
    pipeline = {
        "name": "tolerated-local",
        "inputs": {"items": list(range(20))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "chunk_size": 20,
                "max_parallel": 2,
                "tolerated_failures": "5%",
                "input": {
                    "data": "${{ item }}",
                    "schema": {"type": "string"},
                    "gate": True,
                },
            }
        ],
    }
    async with running_stack(client, settings) as stack:
        handle = await stack.start(pipeline)
        result = await asyncio.wait_for(pipeline_result(handle), 120)
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["tolerated"] == 1 and items["failed"] in (2, 3)
    assert items["failed"] + items["cancelled"] + items["not_started"] == 20
    assert items["not_started"] >= 16
    chunk = f"{handle.id}/each/0"
    assert await _events(client, chunk, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 0
    ran = await _events(client, chunk, EventType.EVENT_TYPE_MARKER_RECORDED)
    assert items["failed"] <= ran <= items["failed"] + items["cancelled"]


async def test_items_by_reference_keep_their_counts_and_redrive(
    client: Client, tmp_path: Path
) -> None:
    # over foreach_inline_items the chunks store their succeeded items and list the
    # others (failed, cancelled, not started); a redrive loads the kept ones
    settings = stack_settings(tmp_path, foreach_inline_items=2)
    world = World(failing={5}, holding={6, 7, 8, 9})
    acts = {"publish": standin("publish", world.publish)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        # chunks of 5, one at a time: chunk 0 succeeds, chunk 1 stops at item 5
        first = await stack.start(_pipeline(10, 0, 5, 5))
        try:
            failed = await asyncio.wait_for(pipeline_result(first), 120)
        finally:
            world.released.set()
        step = failed.steps["each"]
        assert step.error_code == "too_many_failures", step
        assert ItemsRef.of(step.outputs["items"]) is not None
        assert step.items["failed"] == 1 and step.items["succeeded"] == 5
        assert step.items["cancelled"] == 4 and step.items["not_started"] == 0
        world.failing, world.holding, world.called = set(), set(), []
        again = await redrive(client, settings, first.id)
        result = await asyncio.wait_for(again.result(), 120)
    assert result.steps["each"].status == "succeeded"
    assert result.steps["each"].items["reused"] == 5
    assert sorted(world.called) == [5, 6, 7, 8, 9]


async def test_a_cancelled_pipeline_ends_and_its_chunk_returns(
    client: Client, settings: Settings
) -> None:
    # the user cancels the run while its items are held: the run ends cancelled,
    # never stuck, and its chunk closes with it (as without tolerated_failures)
    world = World(failing=set(), holding=set(range(6)))
    acts = {"publish": standin("publish", world.publish)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline(6, 2, 6, 3))
        try:
            await wait_until(lambda: len(world.called) == 3, "three items held", timeout=60)
            await handle.cancel()
            with pytest.raises(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), 120)
        finally:
            world.released.set()
        chunk = client.get_workflow_handle(f"{handle.id}/each/0")
        await wait_until(lambda: _closed(chunk), "the chunk to close", timeout=60)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


async def _closed(handle: Any) -> bool:
    return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING


async def test_a_group_chunk_cancelled_by_the_pipeline_cancels_its_leaves(
    client: Client, settings: Settings
) -> None:
    # 35 leaf chunks of 2 in groups of 2 leaves, two groups at once (one leaf each).
    # Group 0's first leaf fails items 0 and 1 (one tolerated) once group 1's first
    # leaf holds items 4 and 5: the pipeline cancels group 1, which cancels that
    # leaf (its activities cancelled) and starts no leaf more; no other group starts.
    world = World(failing={0, 1}, holding=set(range(4, 70)), fail_after=4)
    result, wid = await _run(client, settings, world, _pipeline(70, 1, 2, 4))
    step = result.steps["each"]
    assert step.status == "failed" and step.error_code == "too_many_failures", step
    items = step.items
    assert items["failed"] == 2 and items["succeeded"] == 0
    assert items["cancelled"] == 2 and items["not_started"] == 66
    assert sorted(world.called) == [0, 1, 4, 5]
    group = client.get_workflow_handle(f"{wid}/each/1")
    assert (await group.describe()).status == WorkflowExecutionStatus.COMPLETED
    asked = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
    assert await _events(client, group.id, asked) == 1
    request = EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
    assert await _events(client, wid, request) == 1
    assert await _events(client, group.id, request) == 1
    leaf = f"{group.id}/0"
    assert await _events(client, leaf, asked) == 1
    cancelled = EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    assert await _events(client, leaf, cancelled) == 2
    started = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    assert await _events(client, wid, started) == 2
    assert await _events(client, group.id, started) == 1
