"""Concurrency keys beyond a single step: on for_each items (across chunks) and on
whole pipelines, and the limiter's lease checks that keep a live holder's slot
and take back a vanished holder's."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

from conftest import running_stack
from support.pipelines import pipeline_result
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import names

STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)


class InFlight:
    """Records, per key, how many validator calls run at once (and when each ran)."""

    def __init__(self, hold: float = 0.3) -> None:
        self.hold = hold
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.spans: dict[str, tuple[float, float]] = {}  # workflow id -> (first start, last end)
        self.gates: dict[str, asyncio.Event] = {}

    def handler(self) -> Any:
        async def validate(request: dict[str, Any]) -> dict[str, Any]:
            key = str(request["input"]["data"]["customer"])
            wid = activity.info().workflow_id or ""
            start = time.monotonic()
            self.running[key] = self.running.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.running[key])
            try:
                gate = self.gates.get(key)
                if gate is not None:
                    await asyncio.wait_for(gate.wait(), 60)
                await asyncio.sleep(self.hold)
            finally:
                self.running[key] -= 1
                first = self.spans.get(wid, (start, start))[0]
                self.spans[wid] = (first, time.monotonic())
            return {"valid": True, "errors": []}

        return standin("validator", validate)


def limiter_id(settings: Settings, key: str) -> str:
    return names.limiter_workflow_id(f"concurrency:{key}", settings.task_queue_suffix)


async def test_for_each_items_share_a_concurrency_key_across_chunks(
    client: Client, settings: Settings
) -> None:
    customers = [{"customer": "c1"}, {"customer": "c2"}] * 4 + [{"name": "no customer"}]
    pipeline = {
        "name": "conc-items",
        "inputs": {"rows": customers},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.rows }}",
                # two items per child workflow: the key is held across four chunks
                "chunk_size": 2,
                "max_parallel": 8,
                "concurrency": {"key": "${{ item.customer }}", "limit": 2},
                "input": {"data": {"customer": "${{ item.customer }}"}, "schema": {}},
            }
        ],
    }
    seen = InFlight()
    # both keys are held at a gate until each has two holders: with two cores under
    # load, ungated c2 calls (0.3 s each) could run one after another and never
    # reach the limit, and validator steps run as local activities, so a held call
    # keeps its chunk's workflow task open and delays its sibling's grant
    gates = [seen.gates.setdefault(key, asyncio.Event()) for key in ("c1", "c2")]
    async with running_stack(
        client, settings, replace_activities={"validator": seen.handler()}
    ) as stack:
        handle = await stack.start(pipeline)
        chunks = [client.get_workflow_handle(f"{handle.id}/each/{k}") for k in range(5)]
        waiting: dict[str, str] = {}

        async def keys_held_and_others_wait() -> bool:
            # two items per key hold it (at the gate); the four others wait at the limiter
            waiting.clear()
            for chunk in chunks:
                try:
                    waiting.update((await chunk.query(names.PROGRESS_QUERY))["waiting"])
                except Exception:
                    continue  # not started yet
            return (
                seen.running.get("c1") == 2
                and seen.running.get("c2") == 2
                and len(waiting) == 4
                and set(waiting.values()) == {"concurrency"}
            )

        await wait_until(
            keys_held_and_others_wait,
            lambda: (
                f"two holders per key and four items waiting: running {seen.running}, "
                f"waiting {waiting}"
            ),
            timeout=60,
        )
        for gate in gates:
            gate.set()
        result = await asyncio.wait_for(handle.result(), 90)
    each = result.steps["each"]
    assert each.status == "partial", each
    assert each.outputs["succeeded"] == 8
    # the item whose key cannot be resolved fails alone, as invalid input
    (error,) = each.outputs["errors"]
    assert (error["index"], error["error_code"]) == (8, "invalid_input")
    assert "customer" in error["message"]
    # never more than the limit per key, across chunks, and the limit was reached
    assert seen.peak == {"c1": 2, "c2": 2}, seen.peak


async def test_pipeline_concurrency_waits_visibly_and_other_keys_run(
    client: Client, settings: Settings
) -> None:
    def pipeline(customer: str, deadline: float | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": "conc-pipeline",
            "inputs": {"customer": customer},
            "concurrency": {"key": "${{ inputs.customer }}", "limit": 1},
            "steps": [
                {
                    "id": f"s{i}",
                    "worker": "validator",
                    "depends_on": [f"s{i - 1}"] if i else [],
                    "input": {"data": {"customer": "${{ inputs.customer }}"}, "schema": {}},
                }
                for i in range(2)
            ],
        }
        if deadline is not None:
            spec["budget"] = {"deadline_seconds": deadline}
        return spec

    seen = InFlight(hold=0.1)
    gate = seen.gates["c1"] = asyncio.Event()
    async with running_stack(
        client, settings, replace_activities={"validator": seen.handler()}
    ) as stack:
        first = await stack.start(pipeline("c1"))
        await wait_until(lambda: _running(seen, "c1"), "the first c1 pipeline's step")
        second = await stack.start(pipeline("c1"))
        hurried = await stack.start(pipeline("c1", deadline=2))
        other = await stack.start(pipeline("c2"))

        async def second_waits() -> bool:
            p = await second.query(names.PROGRESS_QUERY)
            return bool(p["waiting"] == {"": "concurrency"})

        await wait_until(second_waits, "the second c1 pipeline to wait for its slot")
        progress = await second.query(names.PROGRESS_QUERY)
        assert progress["status"] == "waiting"
        assert {s["status"] for s in progress["steps"].values()} == {"pending"}
        described = await second.describe()
        assert described.typed_search_attributes.get(STATUS) == "waiting"
        state = await client.get_workflow_handle(limiter_id(settings, "c1")).query("state")
        assert len(state["holders"]) == 1 and state["holders"][0].startswith(first.id)
        # another key is not slowed: c2 runs to the end while c1 is held
        assert (await asyncio.wait_for(other.result(), 30)).status == "succeeded"
        # a pipeline whose deadline passes while it waits ends rate_limited, nothing ran
        late = await asyncio.wait_for(pipeline_result(hurried), 30)
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(first.result(), second.result()), 60)
        # released at the end: nobody holds c1 any more
        state = await client.get_workflow_handle(limiter_id(settings, "c1")).query("state")
    assert state["holders"] == [] and state["waiting"] == []
    assert [r.status for r in results] == ["succeeded", "succeeded"]
    assert late.status == "failed"
    assert late.error is not None and late.error.code == "rate_limited"
    assert {s.status for s in late.steps.values()} == {"skipped"}
    assert hurried.id not in seen.spans
    # the second c1 pipeline started its first step after the first one's last step ended
    assert seen.spans[second.id][0] >= seen.spans[first.id][1]
    assert seen.peak["c1"] == 1


async def _running(seen: InFlight, key: str) -> bool:
    return seen.running.get(key, 0) > 0


async def test_lease_checks_keep_a_live_holder_and_free_a_vanished_one(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    """Time-skipping: hours of lease checks in a few seconds."""
    key = f"k-{uuid.uuid4().hex[:6]}"

    def pipeline(step: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": "lease",
            "concurrency": {"key": key, "limit": 1},
            "steps": [step],
        }

    # the holder: a step that fails into a human review for days, holding the slot
    holder_spec = pipeline(
        {
            "id": "draft",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {}},
            "on_failure": "escalate",
            "review_timeout_seconds": 7 * 86400,
        }
    )

    async def garbage(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("invalid_output", "the model returned garbage")

    waiter_spec = pipeline(
        {"id": "v", "worker": "validator", "input": {"data": 1, "schema": {"type": "integer"}}}
    )
    no_sa = {"search_attributes": False}  # the time-skipping server has none
    async with running_stack(
        ts_env.client, settings, replace_activities={"aggregator": standin("aggregator", garbage)}
    ) as stack:
        holder = await stack.start(holder_spec, memo=no_sa)

        async def in_review() -> bool:
            p = await holder.query(names.PROGRESS_QUERY)
            return bool(p["awaiting_review"] == ["draft"])

        await wait_until(in_review, "the holder to await review")
        waiter = await stack.start(waiter_spec, memo=no_sa)
        limiter = ts_env.client.get_workflow_handle(limiter_id(settings, key))

        async def queued() -> bool:
            try:
                return bool((await limiter.query("state"))["waiting"])
            except Exception:
                return False

        await wait_until(queued, "the waiter to queue at the limiter")
        # three lease periods (an hour each): the live holder is asked, and keeps the slot.
        # Half an hour per call: the server advances time only between the lease checks'
        # workflow tasks, and one 3.5-hour sleep outlasted its RPC's deadline on a busy
        # CI machine ("Timeout expired")
        for _ in range(7):
            await ts_env.sleep(timedelta(minutes=30))
        state = await limiter.query("state")
        assert len(state["holders"]) == 1 and state["holders"][0].startswith(holder.id)
        assert len(state["waiting"]) == 1
        checks = await _signals(holder, names.LEASE_CHECK_SIGNAL)
        assert checks >= 3, checks
        assert (await waiter.query(names.PROGRESS_QUERY))["waiting"] == {"": "concurrency"}
        # the holder vanishes without giving the slot back: the next check frees it
        await holder.terminate("gone without releasing")
        result = await asyncio.wait_for(waiter.result(), 60)
        state = await limiter.query("state")
        # an idle limiter lives on for minutes; on the time-skipping server its
        # next workflow task, with no worker left, would stop time for later tests
        if (await limiter.describe()).status == WorkflowExecutionStatus.RUNNING:
            await limiter.terminate("test over")
    assert result.status == "succeeded"
    assert state["holders"] == [] and state["waiting"] == []


async def _signals(handle: WorkflowHandle[Any, Any], name: str) -> int:
    n = 0
    async for e in handle.fetch_history_events():
        if (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == name
        ):
            n += 1
    return n
