"""The run config: a pipeline asks for it as ``run-config``; the pipelines
queue still answers its former name, ``limiter-plan``, with the same answer, for
a run of older code whose first workflow task is retried on a new process
(older code replays ``limiter-plan``: the ``run-config-activity`` patch)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from prometheus_client import CollectorRegistry
    from support import history
    from temporalio.client import Client
    from temporalio.worker import Worker as TemporalWorker

    from aiworker.activities.metrics import WorkerMetrics
    from aiworker.activities.runtime import WorkerRuntime
    from aiworker.config.catalog import load_specs
    from aiworker.config.settings import Settings
    from aiworker.schemas import names
    from aiworker.schemas.limits import RunConfig, RunConfigCall
    from aiworker.workers.process.plugin import workflow_runner
    from aiworker.workers.process.plugins import builtin_set
    from aiworker.workers.process.registry import activities_for


@workflow.defn
class AskBothNames:
    """Asks the run config under both names, as new and older pipeline code does."""

    @workflow.run
    async def run(self) -> list[RunConfig]:
        call = RunConfigCall(tenant="default", workers=["validator"], record=["validator"])
        return [
            await workflow.execute_local_activity(
                name,
                call,
                result_type=RunConfig,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            for name in (names.RUN_CONFIG, names.LIMITER_PLAN)
        ]


async def test_the_pipelines_queue_answers_the_run_config_under_both_names(
    client: Client, settings: Settings
) -> None:
    runtime = WorkerRuntime(
        settings, load_specs(), tools={}, metrics=WorkerMetrics(CollectorRegistry())
    )
    queue = f"run-config-{uuid.uuid4().hex[:8]}"
    async with TemporalWorker(
        client,
        task_queue=queue,
        workflows=[AskBothNames],
        workflow_runner=workflow_runner(),
        activities=activities_for(names.PIPELINES_QUEUE, runtime, builtin_set()),
    ):
        handle = await client.start_workflow(
            AskBothNames.run,
            id=f"run-config-{uuid.uuid4()}",
            task_queue=queue,
            # a name nobody answers fails the workflow task again and again: bounded
            execution_timeout=timedelta(seconds=30),
        )
        new, old = await handle.result()
    assert new == old
    assert new.specs["validator"].worker_id == "validator"
    asked = [history.local_activity_type(e) async for e in handle.fetch_history_events()]
    assert [a for a in asked if a is not None] == ["run-config", "limiter-plan"]  # names: keep
