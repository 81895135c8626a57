"""A run a stopped worker left in its cache must not act inside another run.

A worker that stops with runs in its cache drops them without finishing their
coroutines; the garbage collector closes them later, on whatever thread it
runs, and their ``finally`` blocks run there: the review's status reset, the
release of a pipeline's concurrency lease, the terminal status. When that
thread is running another workflow's task, ``workflow.in_workflow()`` is true
and the SDK's calls reach *that* run: an upsert or a signal to a limiter it
never made lands in its history (or a replay of it meets one it cannot
match). The cause of the nondeterminism ``test_cancel_cancels_running_steps``
once showed (a ``SignalExternalWorkflowExecution`` where its history had
scheduled an activity). The finally blocks act only inside their own run.
"""

from __future__ import annotations

import gc
import uuid
from typing import Any

from collector_probe import CollectorProbeWorkflow
from conftest import running_stack
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.process.plugin import workflow_runner

# Escalates at once and waits for a review, holding the pipeline's concurrency
# lease: its coroutines have a status reset and a lease release in their finally.
HELD = {
    "name": "abandoned",
    "concurrency": {"key": "abandoned", "limit": 1},
    "steps": [
        {
            "id": "draft",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {}},
            "on_failure": "escalate",
        }
    ],
}


async def test_a_run_abandoned_by_a_stopped_worker_acts_in_no_other_run(
    client: Client, settings: Settings
) -> None:
    async def garbage(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("invalid_output", "garbage")

    acts = {"aggregator": standin("aggregator", garbage)}
    gc.disable()  # the abandoned coroutines wait for the collector the probe runs
    try:
        async with running_stack(client, settings, replace_activities=acts) as stack:
            held = await stack.start(HELD)

            async def awaiting() -> bool:
                p = await held.query(names.PROGRESS_QUERY)
                return bool(p["awaiting_review"])

            await wait_until(awaiting, "the review")
        # the worker stopped with the run in its cache; another run's task collects
        queue = f"collector-{uuid.uuid4().hex[:8]}"
        async with Worker(
            client,
            task_queue=queue,
            workflows=[CollectorProbeWorkflow],
            workflow_runner=workflow_runner(),
        ):
            probe = await client.start_workflow(
                CollectorProbeWorkflow.run, id=f"collector-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            collected = await probe.result()
    finally:
        gc.enable()
    events = [e async for e in probe.fetch_history_events()]
    kinds = [EventType.Name(e.event_type) for e in events]
    await held.terminate()
    assert collected > 0
    # the probe's own history: started, one task, completed; nothing of the other run
    assert "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" not in kinds, kinds
    assert "EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED" not in kinds, kinds
    assert kinds[-1] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED", kinds
