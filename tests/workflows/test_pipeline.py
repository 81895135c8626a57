"""PipelineWorkflow through a real Temporal server: DAG order and parallelism,
spec checks, when, gates, the validation loop, fallback, merge policies, the
budget ledger, exactly-once publish, cancellation and a large for_each."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import running_stack
from support.history import called_workers, scheduled_activities
from support.pipelines import pipeline_result
from support.standins import Reply, fail, standin
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, CancelledError

from aiworker.activities.publish import Publish
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names

STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)


def _step(
    sid: str, worker: str, worker_input: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    return {"id": sid, "worker": worker, "input": worker_input or {}, **kw}


async def test_independent_steps_run_in_parallel_and_dependents_after(
    client: Client, settings: Settings
) -> None:
    arrived: set[str] = set()
    both = asyncio.Event()
    order: list[str] = []

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        name = req["input"]["branches"]["name"]
        order.append(name)
        if name in ("a", "b"):
            arrived.add(name)
            if arrived == {"a", "b"}:
                both.set()
            # Only returns if the other branch is running at the same time.
            await asyncio.wait_for(both.wait(), 20)
        # Within the aggregator's output_schema (`result` is any JSON), which the
        # spec check holds the references below to.
        seen = req["input"]["branches"].get("seen")
        return {"policy": "all", "result": {"name": name, "seen": seen}, "used": [], "failed": []}

    def branches(**value: Any) -> dict[str, Any]:
        return {"policy": "all", "branches": value}

    pipeline = {
        "name": "dag",
        "steps": [
            _step("a", "aggregator", branches(name="a")),
            _step("b", "aggregator", branches(name="b")),
            _step(
                "c",
                "aggregator",
                branches(
                    name="c",
                    seen=[
                        "${{ steps.a.outputs.result.name }}",
                        "${{ steps.b.outputs.result.name }}",
                    ],
                ),
            ),
        ],
        "output": {"c": "${{ steps.c.outputs.result.seen }}"},
    }
    async with running_stack(
        client, settings, replace_activities={"aggregator": standin("aggregator", handler)}
    ) as stack:
        result = await (await stack.start(pipeline)).result()
    assert result.status == "succeeded"
    assert result.output == {"c": ["a", "b"]}
    assert order[-1] == "c" and set(order[:2]) == {"a", "b"}


@pytest.mark.parametrize(
    ("steps", "needle"),
    [
        ([_step("a", "nope")], "step 'a': field 'worker': unknown worker 'nope'"),
        ([_step("a", "validator"), _step("a", "validator")], "step 'a': duplicate id"),
        (
            [_step("a", "validator", depends_on=["b"]), _step("b", "validator", depends_on=["a"])],
            "field 'depends_on': cycle",
        ),
        (
            [_step("a", "validator", {"data": "${{ steps.zz.outputs }}", "schema": {}})],
            "step 'a': field 'input': reference steps.zz.outputs names unknown step 'zz'",
        ),
        (
            [_step("a", "validator", validate={"schema": {"type": 12}})],
            "step 'a': field 'validate.schema': invalid JSON Schema",
        ),
    ],
)
async def test_an_invalid_spec_fails_before_anything_runs(
    client: Client, settings: Settings, steps: list[dict[str, Any]], needle: str
) -> None:
    async with running_stack(client, settings) as stack:
        handle = await stack.start({"name": "bad", "steps": steps})
        with pytest.raises(WorkflowFailureError) as e:
            await handle.result()
    cause = e.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "invalid_input" and cause.non_retryable
    assert needle in cause.message
    assert await scheduled_activities(handle) == []


async def test_when_skips_and_a_failed_gate_blocks_the_side_effect(
    client: Client, settings: Settings
) -> None:
    pipeline = {
        "name": "gated",
        "inputs": {"product": {"title": ""}, "mode": "quiet"},
        "steps": [
            _step(
                "check",
                "validator",
                {
                    "data": "${{ inputs.product }}",
                    "schema": {"properties": {"title": {"minLength": 1}}},
                },
            ),
            _step(
                "notify",
                "publish",
                {"sink": {"file": "gated.jsonl"}, "record": "${{ inputs.product }}"},
                gate="check",
            ),
            _step(
                "loud",
                "validator",
                {"data": 1, "schema": {}},
                when={"value": "${{ inputs.mode }}", "schema": {"const": "loud"}},
            ),
        ],
    }
    async with running_stack(client, settings) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
        desc = await handle.describe()
    assert result.status == "partial"
    notify = result.steps["notify"]
    assert notify.status == "blocked" and notify.error_code == "validation_failed"
    assert notify.reasons[0]["path"] == "$.title"
    assert result.steps["loud"].status == "skipped"
    assert "publish" not in await scheduled_activities(handle)
    assert not (settings.data_dir / "sinks" / "default" / "gated.jsonl").exists()
    assert desc.typed_search_attributes.get(STATUS) == "partial"


async def test_validation_loop_feeds_reasons_back_and_stops_at_max_attempts(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []

    async def producer(req: dict[str, Any]) -> dict[str, Any]:
        # Gets it right only once the validator's reasons reach it.
        fixed = "feedback" in req["input"]
        return {"policy": "x", "result": {"title": "ok" if fixed else ""}, "used": [], "failed": []}

    schema = {
        "type": "object",
        "properties": {"result": {"properties": {"title": {"minLength": 1}}}},
    }
    step = _step(
        "make",
        "aggregator",
        {"policy": "all", "branches": {}},
        validate={"schema": schema, "max_attempts": 3},
    )
    never = {**step, "id": "never", "validate": {"schema": {"not": {}}, "max_attempts": 2}}
    pipeline = {"name": "loop", "steps": [step, never]}
    acts = {"aggregator": standin("aggregator", producer, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start({**pipeline, "steps": [step]})
        result = await handle.result()
        handle2 = await stack.start({**pipeline, "steps": [{**never, "on_failure": "continue"}]})
        result2 = await handle2.result()
    make = result.steps["make"]
    assert result.status == "succeeded" and make.validation_attempts == 2
    assert make.outputs["result"] == {"title": "ok"}
    reasons = calls[1]["input"]["feedback"]
    assert reasons[0]["path"] == "$.result.title"
    assert calls[1]["idempotency_key"].endswith("/make#attempt-2")
    # The never-valid step stops after exactly max_attempts runs and validations.
    assert await called_workers(handle2) == ["aggregator", "validator"] * 2
    n = result2.steps["never"]
    assert (n.status, n.error_code, n.validation_attempts) == ("failed", "validation_failed", 2)
    assert result2.status == "partial"


async def test_a_worker_rejecting_its_own_output_gets_the_reasons_back(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []
    reason = {"path": "$.age", "message": "'x' is not of type 'integer'", "validator": "type"}

    async def llm_like(req: dict[str, Any]) -> dict[str, Any]:
        if "feedback" not in req["input"]:
            raise fail("invalid_output", "reply fails response_schema", reasons=[reason])
        return {"policy": "all", "result": {"age": 36}, "used": [], "failed": []}

    step = _step("ask", "aggregator", {"policy": "all", "branches": {}}, validate={"schema": {}})
    acts = {"aggregator": standin("aggregator", llm_like, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        result = await (await stack.start({"name": "self-check", "steps": [step]})).result()
    assert result.status == "succeeded"
    assert [c["input"].get("feedback") for c in calls] == [None, [reason]]


async def test_fallback_worker_runs_when_the_worker_fails(
    client: Client, settings: Settings
) -> None:
    async def broken(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("upstream_error", "model down")

    async def backup(req: dict[str, Any]) -> dict[str, Any]:
        return {"published": True, "duplicate": False, "idempotency_key": "k", "sink": "s"}

    pipeline = {
        "name": "fb",
        "steps": [
            _step(
                "main",
                "aggregator",
                {"policy": "all", "branches": {}},
                fallback="publish",
                fallback_input={"sink": {"file": "fb.jsonl"}, "record": {"from": "fallback"}},
            )
        ],
    }
    acts = {"aggregator": standin("aggregator", broken), "publish": standin("publish", backup)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    main = result.steps["main"]
    assert result.status == "succeeded" and main.fallback_used
    assert main.outputs["published"] is True
    assert await called_workers(handle) == ["aggregator", "publish"]


async def test_parallel_branches_merged_by_the_aggregator(
    client: Client, settings: Settings
) -> None:
    def branch(sid: str, label: str) -> dict[str, Any]:
        return _step(sid, "validator", {"data": {"label": label}, "schema": {"type": "object"}})

    pipeline = {
        "name": "merge",
        "inputs": {"labels": {"m1": "cat", "m2": "dog", "m3": "cat"}},
        "steps": [
            branch("m1", "cat"),
            branch("m2", "dog"),
            branch("m3", "cat"),
            _step(
                "vote",
                "aggregator",
                {
                    "policy": "majority",
                    "field": "valid",
                    "branches": {
                        "m1": "${{ steps.m1.outputs }}",
                        "m2": "${{ steps.m2.outputs }}",
                        "m3": "${{ steps.m3.outputs }}",
                    },
                },
            ),
            _step(
                "labels",
                "aggregator",
                {"policy": "merge", "branches": {"a": {"l": "cat"}, "b": {"l": "dog"}}},
            ),
        ],
        "output": {"vote": "${{ steps.vote.outputs.result }}"},
    }
    async with running_stack(client, settings) as stack:
        result = await (await stack.start(pipeline)).result()
    assert result.status == "succeeded"
    assert result.output == {"vote": True}
    labels = result.steps["labels"]
    assert labels.outputs["result"] == {"l": "cat"}
    assert labels.warnings[0]["code"] == "merge_conflict"
    assert "'a'" in labels.warnings[0]["message"] and "'b'" in labels.warnings[0]["message"]


async def test_budget_refuses_a_step_before_it_is_scheduled(
    client: Client, settings: Settings
) -> None:
    seen: list[dict[str, Any]] = []

    async def post(req: dict[str, Any]) -> Reply:
        return Reply(
            {"published": True, "duplicate": False, "idempotency_key": "k", "sink": "hook"},
            usage={"external_calls": 1},
        )

    hook = {"sink": {"webhook": "http://127.0.0.1:9/x"}, "record": {}}
    pipeline = {
        "name": "budget",
        "budget": {"max_external_calls": 1},
        "steps": [_step("one", "publish", hook), _step("two", "publish", hook, depends_on=["one"])],
    }
    acts = {"publish": standin("publish", post, seen)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        result = await pipeline_result(handle)
        progress = await handle.query(names.PROGRESS_QUERY)
        desc = await handle.describe()
    assert result.status == "budget_exhausted"
    two = result.steps["two"]
    assert (two.status, two.error_code) == ("failed", "budget_exceeded")
    assert seen[0]["constraints"]["max_external_calls"] == 1
    assert await scheduled_activities(handle) == ["publish"]
    assert result.usage.external_calls == 1
    assert progress["budget"]["external_calls_left"] == 0
    assert desc.typed_search_attributes.get(STATUS) == "budget_exhausted"


async def test_publish_writes_once_when_the_worker_dies_after_writing(
    client: Client, settings: Settings
) -> None:
    real = Publish().activity(WorkerRuntime(settings, load_specs()))
    attempts: list[int] = []

    async def dies_after_writing(req: dict[str, Any]) -> dict[str, Any]:
        from temporalio import activity

        response = await real(req)
        attempts.append(activity.info().attempt)
        if activity.info().attempt == 1:
            # The side effect happened; the worker vanishes before reporting it.
            raise fail("internal", "worker killed", retryable=True)
        return dict(response.outputs)

    pipeline = {
        "name": "once",
        "steps": [_step("notify", "publish", {"sink": {"file": "once.jsonl"}, "record": {"n": 1}})],
    }
    acts = {"publish": standin("publish", dies_after_writing)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    lines = (settings.data_dir / "sinks" / "default" / "once.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["idempotency_key"] == f"{handle.id}/notify"
    assert attempts == [1, 2]
    assert result.steps["notify"].outputs["duplicate"] is True


async def test_cancel_cancels_running_steps(client: Client, settings: Settings) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        from temporalio import activity

        started.set()
        try:
            for _ in range(300):
                activity.heartbeat()
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    pipeline = {
        "name": "cancel",
        "steps": [
            _step("slow", "publish", {"sink": {"file": "c"}, "record": {}}),
            _step("after", "validator", {"data": 1, "schema": {}}, depends_on=["slow"]),
        ],
    }
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", slow)}
    ) as stack:
        handle = await stack.start(pipeline)
        await asyncio.wait_for(started.wait(), 30)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as e:
            await handle.result()
        progress = await handle.query(names.PROGRESS_QUERY)
        desc = await handle.describe()
    # The activity hears of it on its next heartbeat or, at the latest, when
    # the worker shuts down; either way it ends cancelled, not completed.
    assert cancelled.is_set()
    assert isinstance(e.value.cause, CancelledError)
    assert progress["status"] == "cancelled"
    assert progress["steps"]["slow"]["status"] == "cancelled"
    assert progress["steps"]["after"]["status"] == "cancelled"
    assert desc.typed_search_attributes.get(STATUS) == "cancelled"


async def test_for_each_over_1000_items_stays_bounded(client: Client, settings: Settings) -> None:
    async def noop(req: dict[str, Any]) -> dict[str, Any]:
        return {"n": req["input"]["record"]["n"], "key": req["idempotency_key"]}

    pipeline = {
        "name": "fanout",
        "inputs": {"items": list(range(1000))},
        "steps": [
            _step(
                "each",
                "publish",
                {"sink": {"file": "x"}, "record": {"n": "${{ item }}", "i": "${{ item_index }}"}},
                for_each="${{ inputs.items }}",
                max_parallel=1000,
                chunk_size=250,
            )
        ],
        "output": {"count": "${{ steps.each.outputs.succeeded }}"},
    }
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", noop)}
    ) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    each = result.steps["each"]
    assert result.status == "succeeded" and result.output == {"count": 1000}
    assert each.outputs["items"][999] == {"n": 999, "key": f"{handle.id}/each/999"}
    history = await handle.fetch_history()
    children = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(children) == 4
    assert len(history.events) < 100


async def test_for_each_item_failures_make_the_step_partial(
    client: Client, settings: Settings
) -> None:
    async def odd_fails(req: dict[str, Any]) -> dict[str, Any]:
        if req["input"]["record"] % 2:
            raise fail("not_found", "odd")
        return {"ok": True}

    pipeline = {
        "name": "partial-fanout",
        "steps": [
            _step(
                "each",
                "publish",
                {"sink": {"file": "x"}, "record": "${{ item }}"},
                for_each=[0, 1, 2, 3],
                max_parallel=2,
                chunk_size=2,
                on_failure="continue",
            ),
            _step(
                "firsts",
                "aggregator",
                {"policy": "first_success", "branches": "${{ steps.each.outputs.items }}"},
            ),
        ],
    }
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", odd_fails)}
    ) as stack:
        result = await (await stack.start(pipeline)).result()
    each = result.steps["each"]
    assert each.status == "partial" and each.items == {"total": 4, "succeeded": 2, "failed": 2}
    assert [e["index"] for e in each.outputs["errors"]] == [1, 3]
    assert each.outputs["errors"][0]["error_code"] == "not_found"
    firsts = result.steps["firsts"]
    assert firsts.outputs["result"] == {"ok": True}
    assert [w["field"] for w in firsts.warnings] == ["1", "3"]
    assert result.status == "partial"
    # the partial step is the pipeline's error, its failed items the cause
    error = result.error
    assert error is not None and (error.code, error.step) == ("not_found", "each")
    assert error.message == "2 of 4 items failed; item 1: not_found: odd"
    assert [(c.item, c.code) for c in error.cause] == [(1, "not_found"), (3, "not_found")]


async def test_progress_query_while_waiting(client: Client, settings: Settings) -> None:
    gate = asyncio.Event()

    async def blocked(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(gate.wait(), 30)
        return {}

    pipeline = {
        "name": "progress",
        "steps": [
            _step("fast", "validator", {"data": 1, "schema": {}}),
            _step("slow", "publish", {"sink": {"file": "x"}, "record": {}}),
        ],
    }
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", blocked)}
    ) as stack:
        handle = await stack.start(pipeline)

        async def fast_done() -> bool:
            p = await handle.query(names.PROGRESS_QUERY)
            return bool(p["steps"]["fast"]["status"] == "succeeded")

        await wait_until(fast_done, "the fast step")
        progress = await handle.query(names.PROGRESS_QUERY)
        gate.set()
        await handle.result()
    assert progress["status"] == "running"
    assert progress["steps"]["slow"]["status"] == "running"
    assert progress["steps"]["fast"]["attempts"] == 1
    assert "outputs" not in progress["steps"]["fast"]
