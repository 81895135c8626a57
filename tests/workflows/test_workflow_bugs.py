"""A bug in workflow code waits for a fix; it never ends the run.

An exception that is not one of aiworker's domain errors (``ApplicationError``
with a stable code) fails the *workflow task*: the run stays running with
everything it did in its history, the server retries the task, and a worker
with the fixed code takes the run over and finishes it, without running again
what had finished. The bug is injected into one worker's code by wrapping a
method of a workflow helper module that the sandbox passes through (the same
class objects in every run of this process), and taken out again before the
fixed worker starts: two builds, one after the other, on the same task queue;
unversioned, and as two Worker Deployment builds, where the pinned run is moved
onto the fixed build with ``temporal workflow update-options`` as
docs/operations.md shows.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from prometheus_client import CollectorRegistry
from support.history import events
from support.payloads import stack_settings
from support.standins import standin
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError

from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workers.process.deployments import deployment_name, ensure_current, set_current
from aiworker.workers.process.plugin import WORKFLOW_FAILURE_TYPES
from aiworker.workers.process.replay import Recorded, replay_all
from aiworker.workers.process.worker import build_workers
from aiworker.workflows import steps

BUG = "injected bug: step 'second' cannot start"


def _pipeline() -> dict[str, Any]:
    """Two publish steps in a row; ``publish`` runs as an activity (never local), so
    what the first call did is in the history once its task completed."""
    return {
        "name": "bug-waits",
        "tenant": "acme",
        "steps": [
            {
                "id": "first",
                "worker": "publish",
                "input": {"sink": {"file": "first.jsonl"}, "record": {"n": 1}},
            },
            {
                "id": "second",
                "worker": "publish",
                "depends_on": ["first"],
                "input": {"sink": {"file": "second.jsonl"}, "record": {"n": 2}},
            },
        ],
    }


class Publishes:
    """A same-name ``publish`` stand-in that records which step each call was for."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def _published(self, request: dict[str, Any]) -> dict[str, Any]:
        key = request["idempotency_key"]
        return {"published": True, "duplicate": False, "idempotency_key": key, "sink": "file"}

    def activities(self) -> dict[str, Any]:
        return {names.PUBLISH: standin(names.PUBLISH, self._published, self.calls)}

    @property
    def steps(self) -> list[str]:
        return [c["step_id"] for c in self.calls]


def break_the_step_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken build: its step runner raises for the step ``second``. The class is
    shared by every run of this process (its module is passed through the sandbox)."""
    execute = steps.StepRunner.execute

    async def buggy(self: steps.StepRunner) -> Any:
        if self.step.id == "second":
            raise RuntimeError(BUG)
        return await execute(self)

    monkeypatch.setattr(steps.StepRunner, "execute", buggy)


async def wait_for_the_failed_task(handle: WorkflowHandle[Any, Any]) -> None:
    """Until the history has the workflow task the bug failed; then the run is still
    running, with the first step's activity completed and nothing failed."""

    async def task_failed() -> list[Any]:
        return [
            e.workflow_task_failed_event_attributes
            for e in await events(handle)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]

    failed = await wait_until(task_failed, "the workflow task to fail on the bug")
    assert BUG in failed[0].failure.message
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    history = [e.event_type for e in await events(handle)]
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED in history
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED not in history


async def assert_resumed(handle: WorkflowHandle[Any, Any], publishes: Publishes) -> None:
    """The run succeeded on the fixed code; the first step's activity ran once (in
    the broken build), only the second ran after the fix. Bounded: the server retries
    the failed task with a growing backoff (seconds, then tens of seconds)."""
    result = await asyncio.wait_for(handle.result(), 120)
    assert isinstance(result, PipelineResult)
    assert result.status == "succeeded", result.error
    assert {k: s.status for k, s in result.steps.items()} == {
        "first": "succeeded",
        "second": "succeeded",
    }
    assert publishes.steps == ["first", "second"]
    history = [e.event_type for e in await events(handle)]
    assert history.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 2


async def test_a_bug_fails_the_workflow_task_and_a_fixed_build_resumes_the_run(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = stack_settings(tmp_path)
    publishes = Publishes()
    break_the_step_runner(monkeypatch)
    async with running_stack(client, settings, replace_activities=publishes.activities()) as stack:
        handle = await stack.start(_pipeline())
        await wait_for_the_failed_task(handle)
    assert publishes.steps == ["first"]
    # The fix passes the replay gate over the waiting run: it changes nothing the run
    # did before the bug (the failed task itself is not part of what replays).
    monkeypatch.undo()
    waiting = [Recorded("the waiting run", await handle.fetch_history())]
    assert await replay_all(waiting, data_converter(settings)) == (1, None)

    # The fixed build, on the same task queue: it replays the history and goes on.
    async with running_stack(client, settings, replace_activities=publishes.activities()):
        await assert_resumed(handle, publishes)


async def test_a_pinned_run_moves_onto_the_fixed_build_with_the_temporal_cli(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker Deployments: the run is pinned to the broken build v1; the fix is a new
    # build v2, and the run moves onto it as docs/operations.md says.
    base = stack_settings(tmp_path, versioning=True)
    v1 = base.model_copy(update={"build_id": "v1"})
    v2 = base.model_copy(update={"build_id": "v2", "deployment_current": "never"})
    name = deployment_name(base)
    publishes = Publishes()
    break_the_step_runner(monkeypatch)
    async with running_stack(client, v1, replace_activities=publishes.activities()) as old:
        assert await ensure_current(client, v1) == "v1"
        handle = await old.start(_pipeline())
        await wait_for_the_failed_task(handle)
    monkeypatch.undo()
    async with running_stack(client, v2, replace_activities=publishes.activities()):
        assert await ensure_current(client, v2) == "v1"  # v2 registered, not current yet
        await set_current(client, name, "v2")  # new runs; this one stays pinned to v1
        moved = await asyncio.to_thread(
            subprocess.run,
            [
                temporal_cli_path(),
                "workflow",
                "update-options",
                "--workflow-id",
                handle.id,
                "--versioning-override-behavior",
                "pinned",
                "--versioning-override-deployment-name",
                name,
                "--versioning-override-build-id",
                "v2",
                "--address",
                client.service_client.config.target_host,
                "--namespace",
                client.namespace,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        await assert_resumed(handle, publishes)
    versioning = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    assert versioning.versioning_override.pinned.version.build_id == "v2"


async def test_the_workers_fail_runs_only_on_aiworker_domain_errors(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path)
    runtime = WorkerRuntime(settings, load_specs(), metrics=WorkerMetrics(CollectorRegistry()))
    (worker,) = build_workers(client, settings, runtime, [names.PIPELINES_QUEUE])
    types = worker.config(active_config=True)["workflow_failure_exception_types"]
    assert list(types) == list(WORKFLOW_FAILURE_TYPES) == [ApplicationError]
    assert not any(issubclass(RuntimeError, t) or issubclass(KeyError, t) for t in types)
