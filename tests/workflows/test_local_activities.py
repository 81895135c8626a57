"""Workers whose spec says ``"execution": "local"`` (validator, aggregator) run as
local activities in the process that runs the pipeline: one marker event in the
history instead of the activity's scheduled/started/completed events, with the
same results, codes and attempts as an activity. Real Temporal server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import installed_workers, running_stack
from support import history
from support.payloads import stack_settings
from support.pipelines import pipeline_result
from support.standins import fail, standin
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.cli import main as cli


def _check(sid: str, data: Any, **kw: Any) -> dict[str, Any]:
    schema = {"type": "integer"}
    return {"id": sid, "worker": "validator", "input": {"data": data, "schema": schema}, **kw}


def _agg(sid: str = "agg", **kw: Any) -> dict[str, Any]:
    return {"id": sid, "worker": "aggregator", "input": {"policy": "all", "branches": {}}, **kw}


def test_the_shipped_specs_of_validator_and_aggregator_run_local() -> None:
    specs = load_specs()
    assert {w for w, s in specs.items() if s.execution == "local"} == {"validator", "aggregator"}


async def test_a_validator_step_is_a_local_activity_not_an_activity_task(
    client: Client, settings: Settings
) -> None:
    # a process polling only the pipelines queue runs it (the validator's activity
    # is registered beside the workflows)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        handle = await stack.start(
            {"name": "local", "steps": [_check("ok", 3), _check("bad", "x", depends_on=["ok"])]}
        )
        result = await handle.result()
    assert result.status == "succeeded"
    assert result.steps["ok"].outputs == {"valid": True, "errors": []}
    assert result.steps["bad"].outputs["valid"] is False
    assert result.steps["ok"].attempts == 1
    assert await history.local_activities(handle) == ["validator", "validator"]
    assert await history.scheduled_activities(handle) == []
    assert await history.count(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED) == 0


async def test_a_non_local_worker_is_still_an_activity(client: Client, settings: Settings) -> None:
    pipeline = {
        "name": "mixed",
        "steps": [
            _check("check", 1),
            {
                "id": "pub",
                "worker": "publish",
                "depends_on": ["check"],
                "input": {"sink": {"file": "mixed.jsonl"}, "record": {"n": 1}},
            },
        ],
    }
    async with running_stack(client, settings) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    assert result.status == "succeeded"
    assert await history.scheduled_activities(handle) == ["publish"]
    assert await history.local_activities(handle) == ["validator"]


async def test_the_setting_off_runs_every_call_as_an_activity(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, local_activities=False)
    async with running_stack(client, settings) as stack:
        merge = {"policy": "merge", "branches": {"a": {"x": 1}}}
        handle = await stack.start({"name": "off", "steps": [_check("v", 1), _agg(input=merge)]})
        result = await handle.result()
    assert result.status == "succeeded"
    assert sorted(await history.scheduled_activities(handle)) == ["aggregator", "validator"]
    assert await history.local_activities(handle) == []


def test_the_setting_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).local_activities is True
    assert Settings.from_env({"AIWORKER_LOCAL_ACTIVITIES": "false"}).local_activities is False


# (handler, expected code, expected attempts): what a stand-in raises on every attempt
FAILURES = {
    # retryable, no ErrorInfo saying the attempt: the spec's 3 attempts, all used
    "retryable": (lambda: ApplicationError("flaky", type="upstream_error"), "upstream_error", 3),
    # non-retryable: one attempt
    "non-retryable": (lambda: fail("invalid_output", "wrong shape"), "invalid_output", 1),
}


@pytest.mark.parametrize("local", [True, False], ids=["local", "activity"])
@pytest.mark.parametrize("kind", sorted(FAILURES))
async def test_failures_end_with_the_same_code_and_attempts_either_way(
    client: Client, tmp_path: Path, local: bool, kind: str
) -> None:
    raise_it, code, attempts = FAILURES[kind]
    calls: list[dict[str, Any]] = []

    async def broken(req: dict[str, Any]) -> dict[str, Any]:
        raise raise_it()

    settings = stack_settings(tmp_path, local_activities=local)
    acts = {"aggregator": standin("aggregator", broken, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start({"name": "fails", "steps": [_agg()]})
        result = await pipeline_result(handle)
    step = result.steps["agg"]
    assert result.status == "failed"
    assert (step.status, step.error_code, step.attempts) == ("failed", code, attempts)
    assert len(calls) == attempts
    assert result.error is not None and result.error.code == code
    assert (await history.local_activities(handle) != []) is local
    assert await history.workflow_task_failures(handle) == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("local", [True, False], ids=["local", "activity"])
async def test_a_stuck_worker_times_out_with_the_same_code_and_attempts_either_way(
    client: Client, tmp_path: Path, local: bool
) -> None:
    calls: list[dict[str, Any]] = []

    async def stuck(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(60)
        return {}

    # the step's timeout (0.5 s) plus the grace of 5 s is Temporal's start-to-close
    step = _agg(timeout_seconds=0.5, retry={"max_attempts": 2})
    settings = stack_settings(tmp_path, local_activities=local)
    acts = {"aggregator": standin("aggregator", stuck, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start({"name": "stuck", "steps": [step]})
        result = await asyncio.wait_for(pipeline_result(handle), 60)
    agg = result.steps["agg"]
    assert (agg.status, agg.error_code, agg.attempts) == ("failed", "timeout", 2)
    assert len(calls) == 2
    assert await history.workflow_task_failures(handle) == 0


async def test_for_each_items_run_as_local_activities_in_their_chunks(
    client: Client, settings: Settings
) -> None:
    step = {
        "id": "each",
        "worker": "validator",
        "for_each": [1, "two", 3, 4, 5],
        "chunk_size": 2,
        "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
    }
    async with running_stack(client, settings) as stack:
        handle = await stack.start({"name": "each", "steps": [step]})
        result = await handle.result()
    assert result.status == "succeeded"
    items = result.steps["each"].outputs["items"]
    assert [i["valid"] for i in items] == [True, False, True, True, True]
    for k, size in enumerate([2, 2, 1]):
        chunk = client.get_workflow_handle(f"{handle.id}/each/{k}")
        assert await history.local_activities(chunk) == ["validator"] * size
        assert await history.scheduled_activities(chunk) == []


async def test_cancelling_a_pipeline_cancels_its_running_local_activity(
    client: Client, settings: Settings
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def held(req: dict[str, Any]) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    acts = {"aggregator": standin("aggregator", held)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start({"name": "cancel", "steps": [_agg()]})
        await asyncio.wait_for(started.wait(), 30)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as e:
            await asyncio.wait_for(handle.result(), 30)
        progress = await handle.query(names.PROGRESS_QUERY)
    assert cancelled.is_set()
    assert isinstance(e.value.cause, CancelledError)
    assert progress["steps"]["agg"]["status"] == "cancelled"


def _spec(**over: Any) -> dict[str, Any]:
    raw = json.loads(load_specs()["validator"].model_dump_json())
    return {**raw, **over}


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"implementation": {"kind": "external"}}, "an external worker is another process"),
        ({"task_queue": "acme-text"}, 'needs task_queue "aiworker-pipelines"'),
        ({"heartbeat_seconds": 5}, "cannot heartbeat"),
        ({"side_effects": True}, "side_effects"),
        ({"constraints": {"timeout_seconds": 600}}, "timeout_seconds 600 is over 60"),
        ({"constraints": {"timeout_seconds": 5, "tools_allowed": ["fetch_url"]}}, "fetch_url"),
    ],
    ids=["external", "queue", "heartbeat", "side-effects", "long", "network"],
)
def test_a_spec_that_cannot_run_local_is_refused_naming_the_field(
    over: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError) as e:
        WorkerSpec.model_validate(_spec(execution="local", **over))
    assert 'execution: "local"' in str(e.value) and says in str(e.value)
    # the same spec without the field is fine
    WorkerSpec.model_validate(_spec(execution="activity", **over))


def test_an_external_spec_file_saying_local_stops_the_process_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = _spec(worker_id="ext-check", implementation={"kind": "external"}, execution="local")
    (specs / "ext-check.json").write_text(json.dumps(spec))
    monkeypatch.setenv("AIWORKER_WORKER_SPECS", str(specs))
    with pytest.raises(SystemExit) as e:
        cli.main(["workers"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "ext-check.json" in err and 'execution: "local"' in err
    assert "external worker is another process" in err


async def test_a_plugin_worker_saying_local_runs_local(client: Client, tmp_path: Path) -> None:
    settings = stack_settings(tmp_path, worker_modules=("support.local_workers",))
    pipeline = {
        "name": "plugin-local",
        "steps": [{"id": "up", "worker": "upper-local", "input": {"text": "abc"}}],
        "output": {"text": "${{ steps.up.outputs.text }}"},
    }
    with installed_workers(settings) as workers:
        async with running_stack(client, settings, workers=workers) as stack:
            handle = await stack.start(pipeline)
            result = await handle.result()
    assert result.status == "succeeded" and result.output == {"text": "ABC"}
    assert await history.local_activities(handle) == ["upper-local"]
    assert await history.scheduled_activities(handle) == []
