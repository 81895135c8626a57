"""``aiworker schedule ...`` against the real dev server (the time-skipping server has
no Schedules): runs on an interval under ids derived from the schedule and the
run's time, idempotency keys stable per run, trigger, pause and unpause, list,
describe, delete, the skip overlap policy, and every refusal as one line with
its exit code."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, running_stack
from support.procs import run_cli_module, worker_env
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio import activity
from temporalio.client import (
    Client,
    ScheduleCalendarSpec,
    ScheduleIntervalSpec,
    ScheduleRange,
    ScheduleSpec,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.publish import Publish
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.flow import flow_workflow_id
from aiworker.schemas.flow_state import FlowAnswer
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.cli.common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workers.schedules.schedules import (
    create_schedule,
    describe_schedule,
    list_schedules,
    trigger_schedule,
)
from aiworker.workers.schedules.specs import (
    ScheduleOptions,
    calendar_text,
    format_duration,
    parse_duration,
    parse_interval,
    spec_text,
)

# A run's id: the schedule's workflow id and the run's nominal time (whole seconds, UTC).
RUN_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def cli_env(stack: Stack) -> dict[str, str]:
    return worker_env(stack.client, stack.settings, stack.settings.data_dir)


async def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli_module, ["schedule", *args], cli_env(stack))


def publish_pipeline(name: str, sink: str) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "steps": [
            {
                "id": "notify",
                "worker": "publish",
                "input": {"sink": {"file": sink}, "record": {"pipeline": name}},
            }
        ],
    }


def sink_keys(settings: Settings, sink: str) -> list[str]:
    path = settings.data_dir / "sinks" / "acme" / sink
    if not path.exists():
        return []
    return [json.loads(line)["idempotency_key"] for line in path.read_text().splitlines()]


async def delete_quietly(client: Client, schedule_id: str) -> None:
    try:
        await client.get_schedule_handle(schedule_id).delete()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise


async def finished_runs(client: Client, schedule_id: str, n: int) -> list[dict[str, Any]]:
    """Wait (bounded) for ``n`` runs of the schedule that ended, and return them."""

    async def ended() -> list[dict[str, Any]]:
        doc = await describe_schedule(client, schedule_id)
        done = [r for r in doc["recent"] if r["status"] not in ("queued", "running")]
        return done if len(done) >= n else []

    return await wait_until(ended, f"{n} finished runs of schedule {schedule_id}", timeout=40)


async def test_a_schedule_runs_the_pipeline_under_ids_from_its_time(
    stack: Stack, tmp_path: Path
) -> None:
    sid = f"every-{uuid.uuid4().hex[:8]}"
    f = tmp_path / "p.json"
    f.write_text(json.dumps({**publish_pipeline("scheduled", "scheduled.jsonl"), "priority": 2}))
    created = await cli(stack, "create", str(f), "--schedule-id", sid, "--interval", "1s")
    try:
        assert created.returncode == EXIT_OK, created.stderr
        assert created.stdout.startswith(f"created schedule {sid!r}: every 1s; next run ")
        assert f"runs start as workflow {sid}-<time>" in created.stdout
        runs = await finished_runs(stack.client, sid, 2)
    finally:
        await stack.client.get_schedule_handle(sid).pause()
    ids = [r["workflow_id"] for r in runs]
    assert all(re.fullmatch(f"{sid}-{RUN_TIME}", wid) for wid in ids), ids
    assert len(set(ids)) == len(ids)
    assert {r["status"] for r in runs} == {"succeeded"}
    # Started as `aiworker run` starts a pipeline: type, queue, search attributes.
    desc = await stack.client.get_workflow_handle(ids[0]).describe()
    assert desc.workflow_type == names.PIPELINE_WORKFLOW
    assert desc.task_queue == stack.pipelines_queue
    assert desc.typed_search_attributes.get(names.TENANT_KEY) == "acme"
    assert desc.typed_search_attributes.get(names.PIPELINE_KEY) == "scheduled"
    async for event in stack.client.get_workflow_handle(ids[0]).fetch_history_events():
        priority = event.workflow_execution_started_event_attributes.priority
        assert (priority.priority_key, priority.fairness_key) == (2, "acme")
        break
    # Each run published under its own key: `<run id>/notify`.
    keys = sink_keys(stack.settings, "scheduled.jsonl")
    assert {f"{wid}/notify" for wid in ids} <= set(keys)
    assert len(keys) == len(set(keys))

    described = await cli(stack, "describe", sid)
    assert described.returncode == EXIT_OK, described.stderr
    assert "pipeline     scheduled (tenant acme)" in described.stdout
    assert f"starts       PipelineWorkflow on {stack.pipelines_queue}" in described.stdout
    assert "spec         every 1s" in described.stdout
    assert "policy       overlap Skip" in described.stdout
    assert f"  {runs[0]['scheduled_at']}  {ids[0]}  succeeded" in described.stdout
    # The temporal CLI reads the same schedule.
    temporal = await asyncio.to_thread(
        subprocess.run,
        [temporal_cli_path(), "schedule", "describe", "-s", sid, "-o", "json"],
        env=cli_env(stack),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert temporal.returncode == 0, temporal.stderr
    assert json.loads(temporal.stdout)["schedule"]["action"]["startWorkflow"]["workflowType"] == {
        "name": names.PIPELINE_WORKFLOW
    }

    deleted = await cli(stack, "delete", sid)
    assert deleted.returncode == EXIT_OK, deleted.stderr
    assert deleted.stdout.strip() == (
        f"deleted schedule {sid!r} (the runs it started are not affected)"
    )
    gone = await cli(stack, "describe", sid)
    assert gone.returncode == EXIT_NOT_FOUND
    assert gone.stderr.strip() == (
        f"aiworker: schedule {sid!r} not found in this namespace (see `aiworker schedule list`)"
    )


async def test_a_redelivered_step_keeps_its_key_inside_a_scheduled_run(
    client: Client, settings: Settings
) -> None:
    real = Publish().activity(WorkerRuntime(settings, load_specs()))
    seen: list[tuple[str, int]] = []

    async def dies_after_writing_once(req: dict[str, Any]) -> dict[str, Any]:
        response = await real(req)
        attempt = activity.info().attempt
        seen.append((req["idempotency_key"], attempt))
        if attempt == 1 and len(seen) == 1:
            # Written, then the worker vanishes: Temporal delivers the step again.
            raise fail("internal", "worker killed", retryable=True)
        return dict(response.outputs)

    sid = f"redeliver-{uuid.uuid4().hex[:8]}"
    acts = {"publish": standin("publish", dies_after_writing_once)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        pipelines = PipelineClient(client, settings)
        paused = ScheduleOptions(cron=["0 0 1 1 *"], paused=True)
        await create_schedule(pipelines, sid, publish_pipeline("redeliver", "r.jsonl"), paused)
        try:
            first = await trigger_schedule(client, sid)
            (run1,) = await finished_runs(client, sid, 1)
            await asyncio.sleep(1)  # the next run's time is a later second, so another id
            second = await trigger_schedule(client, sid)
            runs = await finished_runs(client, sid, 2)
        finally:
            await delete_quietly(client, sid)
    assert first.workflow_id == run1["workflow_id"]
    assert second.workflow_id == runs[1]["workflow_id"] != first.workflow_id
    one, two = (f"{r['workflow_id']}/notify" for r in runs)
    # The first run's step came twice under one key; the second run has its own.
    assert seen == [(one, 1), (one, 2), (two, 1)]
    assert sink_keys(stack.settings, "r.jsonl") == [one, two]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]


async def test_skip_overlap_starts_nothing_while_a_run_runs(
    client: Client, settings: Settings
) -> None:
    release = asyncio.Event()

    async def held(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(release.wait(), 25)
        return {"valid": True}

    pipeline = {
        "name": "held",
        "steps": [{"id": "hold", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    sid = f"overlap-{uuid.uuid4().hex[:8]}"
    acts = {"validator": standin("validator", held)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        every = ScheduleOptions(intervals=[parse_interval("1s")])
        await create_schedule(PipelineClient(client, settings), sid, pipeline, every)
        try:

            async def skipped() -> dict[str, Any] | None:
                doc = await describe_schedule(client, sid)
                return doc if doc["actions"]["skipped_overlap"] >= 1 else None

            doc = await wait_until(skipped, "a run skipped by the overlap policy", timeout=30)
            triggered = await cli(stack, "trigger", "-s", sid)
            assert doc["actions"]["total"] == 1 and len(doc["running"]) == 1
            assert triggered.returncode == EXIT_FAILED
            assert triggered.stderr.strip() == (
                f"aiworker: schedule {sid!r}: the run was skipped, one is still running "
                "(overlap policy); `--overlap-policy AllowAll` starts one beside it"
            )
            after = await describe_schedule(client, sid)
            assert after["actions"]["total"] == 1  # still the one run
        finally:
            await client.get_schedule_handle(sid).pause()
            release.set()
            await delete_quietly(client, sid)


async def test_pause_unpause_list_and_describe(stack: Stack, tmp_path: Path) -> None:
    sid = f"nightly-{uuid.uuid4().hex[:8]}"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(publish_pipeline(f"list-{sid}", "n.jsonl")))
    created = await cli(
        stack,
        "create",
        str(f),
        "-s",
        sid,
        "--cron",
        "30 3 * * 1-5",
        "--time-zone",
        "Europe/Berlin",
        "--jitter",
        "30s",
        "--catchup-window",
        "10m",
        "--overlap-policy",
        "buffer-one",
        "--notes",
        "weekday mornings",
        "--paused",
    )
    try:
        assert created.returncode == EXIT_OK, created.stderr
        assert created.stdout.strip() == (
            f"created schedule {sid!r}: cron 30 3 * * 1-5 (Europe/Berlin), jitter 30s; "
            f"paused; runs start as workflow {sid}-<time>"
        )

        async def listed() -> subprocess.CompletedProcess[str] | None:
            proc = await cli(stack, "list", "--pipeline", f"list-{sid}")
            return proc if sid in proc.stdout else None

        shown = await wait_until(listed, f"{sid} in `aiworker schedule list`", timeout=30)
        header, line = shown.stdout.splitlines()
        assert header.split() == ["schedule", "id", "pipeline", "next", "run", "paused", "spec"]
        assert line.split()[0] == sid and line.split()[1] == f"list-{sid}"
        assert re.search(f"{RUN_TIME} +yes +cron 30 3 \\* \\* 1-5 \\(Europe/Berlin\\)", line)
        as_json = await cli(stack, "list", "--tenant", "acme", "--json")
        (row,) = [r for r in json.loads(as_json.stdout) if r["schedule_id"] == sid]
        assert row["paused"] is True and row["note"] == "weekday mornings"
        assert row["tenant"] == "acme"

        described = await cli(stack, "describe", sid, "--json")
        doc = json.loads(described.stdout)
        assert doc["spec"]["cron"] == ["30 3 * * 1-5"]
        assert doc["spec"]["time_zone"] == "Europe/Berlin" and doc["spec"]["jitter"] == "30s"
        assert doc["policy"] == {
            "overlap": "BufferOne",
            "catchup_window": "10m",
            "pause_on_failure": False,
        }
        assert doc["state"] == {"paused": True, "note": "weekday mornings"}
        assert len(doc["next_runs"]) >= 1

        unpaused = await cli(stack, "unpause", sid)
        assert unpaused.stdout.strip() == f"schedule {sid!r} unpaused"
        assert (await describe_schedule(stack.client, sid))["state"]["paused"] is False
        paused = await cli(stack, "pause", "-s", sid, "--note", "maintenance")
        assert paused.stdout.strip() == f"schedule {sid!r} paused"
        text = (await cli(stack, "describe", "-s", sid)).stdout
        assert "state        paused (maintenance)" in text
        assert "recent runs  none" in text
    finally:
        await delete_quietly(stack.client, sid)


async def test_refusals_are_one_line_with_an_exit_code(stack: Stack, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(publish_pipeline("refusals", "x.jsonl")))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "steps": [{"id": "a", "worker": "nope"}]}))
    sid = f"refuse-{uuid.uuid4().hex[:8]}"

    invalid = await cli(stack, "create", str(bad), "-s", sid, "--interval", "1h")
    assert invalid.returncode == EXIT_USAGE
    assert invalid.stderr.startswith(f"aiworker: {bad}: step 'a'")
    cron = await cli(stack, "create", str(good), "-s", sid, "--cron", "61 * * * *")
    assert cron.returncode == EXIT_USAGE
    assert cron.stderr.strip() == (
        "aiworker: invalid schedule: --cron '61 * * * *': Minute is not in range [0-59]"
    )
    zone = await cli(
        stack, "create", str(good), "-s", sid, "--cron", "@daily", "--time-zone", "Mars/Base"
    )
    assert zone.returncode == EXIT_USAGE
    assert "invalid schedule: --time-zone 'Mars/Base': unknown time zone" in zone.stderr
    no_time = await cli(stack, "create", str(good), "-s", sid)
    assert no_time.returncode == EXIT_USAGE
    assert "--cron/--interval: a schedule needs a cron line or an interval" in no_time.stderr
    interval = await cli(stack, "create", str(good), "-s", sid, "--interval", "soon")
    assert interval.returncode == EXIT_USAGE
    assert "argument --interval: 'soon' is not a duration like 90s" in interval.stderr
    policy = await cli(
        stack, "create", str(good), "-s", sid, "--interval", "1h", "--overlap-policy", "wait"
    )
    assert policy.returncode == EXIT_USAGE
    assert "'wait' is not one of Skip, BufferOne, BufferAll" in policy.stderr
    # Nothing of the above was created.
    with pytest.raises(RPCError) as nothing:
        await stack.client.get_schedule_handle(sid).describe()
    assert nothing.value.status == RPCStatusCode.NOT_FOUND

    try:
        first = await cli(stack, "create", str(good), "-s", sid, "--interval", "1h", "--paused")
        again = await cli(stack, "create", str(good), "-s", sid, "--interval", "1h")
        assert first.returncode == EXIT_OK, first.stderr
        assert again.returncode == EXIT_USAGE
        assert again.stderr.strip() == (
            f"aiworker: schedule {sid!r} already exists; delete it first "
            f"(`aiworker schedule delete {sid}`) or pick another --schedule-id"
        )
    finally:
        await delete_quietly(stack.client, sid)

    for action in ("describe", "pause", "unpause", "trigger", "delete"):
        proc = await cli(stack, action, "no-such-schedule")
        assert proc.returncode == EXIT_NOT_FOUND, (action, proc.stderr)
        assert proc.stderr.strip() == (
            "aiworker: schedule 'no-such-schedule' not found in this namespace "
            "(see `aiworker schedule list`)"
        )
    missing = await cli(stack, "pause")
    assert missing.returncode == EXIT_USAGE
    assert "give the schedule id (SCHEDULE_ID or -s ID)" in missing.stderr


@pytest.mark.parametrize(
    ("text", "seconds", "written"),
    [
        ("90s", 90, "1m30s"),
        ("1h30m", 5400, "1h30m"),
        ("500ms", 0.5, "500ms"),
        ("2d", 172800, "2d"),
        ("1.5s", 1.5, "1.5s"),
        ("0", 0, "0s"),
    ],
)
def test_durations_read_and_write_as_temporal_writes_them(
    text: str, seconds: float, written: str
) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert format_duration(parse_duration(text)) == written


@pytest.mark.parametrize("text", ["", "5", "1x", "h", "1h 30m", "-5s"])
def test_a_bad_duration_says_what_one_looks_like(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration like 90s, 15m, 1h30m or 500ms"):
        parse_duration(text)


def test_a_calendar_reads_as_the_cron_line_it_stands_for() -> None:
    # As the server keeps `--cron "*/15 9-17 * * 1-5"` (and as the UI writes one).
    cal = ScheduleCalendarSpec(
        second=[ScheduleRange(0)],
        minute=[ScheduleRange(0, 59, 15)],
        hour=[ScheduleRange(9, 17)],
        day_of_month=[ScheduleRange(1, 31)],
        month=[ScheduleRange(1, 12)],
        day_of_week=[ScheduleRange(1, 5)],
    )
    assert calendar_text(cal) == "*/15 9-17 * * 1-5"
    every_ten_seconds = ScheduleCalendarSpec(
        second=[ScheduleRange(0, 59, 10)],
        minute=[ScheduleRange(0, 59)],
        hour=[ScheduleRange(0, 23)],
    )
    assert calendar_text(every_ten_seconds) == "*/10 * * * * *"
    spec = ScheduleSpec(
        calendars=[cal],
        intervals=[ScheduleIntervalSpec(timedelta(hours=6), timedelta(hours=5))],
        time_zone_name="US/Central",
    )
    assert spec_text(spec) == "cron */15 9-17 * * 1-5; every 6h/5h (US/Central)"
    assert parse_interval("6h/5h") == ScheduleIntervalSpec(timedelta(hours=6), timedelta(hours=5))


def flow_pipeline(name: str, flow: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"customer": "c1"},
        "flow": {"key": "${{ inputs.customer }}", **flow},
        "steps": [{"id": "hold", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }


async def scheduled_answer(client: Client, sid: str) -> tuple[str, FlowAnswer | BaseException]:
    """Trigger the schedule and wait for its ScheduledFlowStart to end: its id and its
    answer (or the failure it ended with)."""
    triggered = await trigger_schedule(client, sid)
    assert triggered.workflow_id is not None and not triggered.skipped, triggered
    handle = client.get_workflow_handle(triggered.workflow_id, result_type=FlowAnswer)
    try:
        return triggered.workflow_id, await asyncio.wait_for(handle.result(), 30)
    except WorkflowFailureError as e:
        return triggered.workflow_id, e.cause


async def test_a_schedule_starts_a_flow_pipeline_through_its_flow(
    client: Client, settings: Settings
) -> None:
    """A schedule's start of a pipeline with `flow` goes through the key's flow, as
    `aiworker run` does: `singleton: refuse` refuses the second start while the first
    run holds the key (the scheduled start fails with flow_refused), and `singleton:
    wait` queues it behind that run, which then starts when the first ends."""
    release = asyncio.Event()

    async def held(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(release.wait(), 60)
        return {"valid": True}

    acts = {"validator": standin("validator", held)}
    hourly = ScheduleOptions(intervals=[parse_interval("1h")])
    refuse_name, wait_name = f"refuse-{uuid.uuid4().hex[:6]}", f"wait-{uuid.uuid4().hex[:6]}"
    refuse_sid, wait_sid = f"s-{refuse_name}", f"s-{wait_name}"
    pc = PipelineClient(client, settings)
    async with running_stack(client, settings, replace_activities=acts):
        await create_schedule(
            pc, refuse_sid, flow_pipeline(refuse_name, {"singleton": "refuse"}), hourly
        )
        await create_schedule(pc, wait_sid, flow_pipeline(wait_name, {"singleton": "wait"}), hourly)
        try:
            doc = await describe_schedule(client, refuse_sid)
            assert doc["workflow_type"] == names.FLOW_SCHEDULED_WORKFLOW

            async def listed() -> list[str]:
                rows = await list_schedules(client, tenant="acme", pipeline=refuse_name)
                return [r.schedule_id for r in rows]

            assert await wait_until(listed, "the schedule in the list", timeout=20) == [refuse_sid]

            # singleton: refuse
            _, first = await scheduled_answer(client, refuse_sid)
            assert isinstance(first, FlowAnswer) and first.status == "started", first
            held_id = flow_workflow_id("acme", refuse_name, "c1", settings.task_queue_suffix)
            assert first.workflow_id == held_id
            _, second = await scheduled_answer(client, refuse_sid)
            assert isinstance(second, ApplicationError), second
            assert second.type == ErrorCode.FLOW_REFUSED.value
            assert "holds flow key 'c1'" in second.message

            # singleton: wait
            _, w1 = await scheduled_answer(client, wait_sid)
            _, w2 = await scheduled_answer(client, wait_sid)
            assert isinstance(w1, FlowAnswer) and w1.status == "started", w1
            assert isinstance(w2, FlowAnswer) and w2.status == "queued", w2
            assert w2.behind == w1.workflow_id and w2.workflow_id != w1.workflow_id
            release.set()
            for run in (w1, w2):

                async def ended(wid: str = run.workflow_id) -> str | None:
                    try:
                        desc = await client.get_workflow_handle(wid).describe()
                    except RPCError:
                        return None
                    status = desc.status
                    return status.name if status and status.name != "RUNNING" else None

                assert await wait_until(ended, f"run {run.workflow_id} to end", timeout=40) == (
                    "COMPLETED"
                )
            result = await client.get_workflow_handle(held_id).result()
            assert result["status"] == "succeeded"
        finally:
            release.set()
            for sid in (refuse_sid, wait_sid):
                await delete_quietly(client, sid)


async def test_a_flow_key_that_resolves_to_nothing_refuses_the_schedule(
    client: Client, settings: Settings
) -> None:
    """The key resolves from the schedule's fixed inputs when it is created: one that
    resolves to nothing is refused then, naming `flow.key`, and nothing is created."""
    pipeline = {**flow_pipeline("nokey", {"debounce": {"seconds": 5}}), "inputs": {}}
    sid = f"flow-{uuid.uuid4().hex[:8]}"
    options = ScheduleOptions(intervals=(parse_interval("1h"),))
    with pytest.raises(PipelineSpecError) as refused:
        await create_schedule(PipelineClient(client, settings), sid, pipeline, options, check=False)
    assert "flow.key" in str(refused.value)
    with pytest.raises(RPCError) as nothing:
        await client.get_schedule_handle(sid).describe()
    assert nothing.value.status == RPCStatusCode.NOT_FOUND
