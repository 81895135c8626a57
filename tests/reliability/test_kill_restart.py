"""A worker process killed with SIGKILL in the middle of a step, then restarted.

The ``publish`` step writes its record and then holds; the test kills the
process during the hold (after the write, before the activity completes),
starts a fresh process, and expects Temporal to time the lost attempt out
(start-to-close), retry it on the new process with the same idempotency key,
and the sink to hold the record exactly once.

The worker process is ``aiworker worker`` with one registry line swapped:
the real ``publish`` worker followed by a hold (``SlowPublish``), so that
the kill lands after the write and before the activity completes.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from support import history
from support.procs import WorkerProcess, worker_env
from support.standins import publish_step, read_jsonl, slow_publish_worker
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import start_pipeline

HOLD_SECONDS = 3.0
STEP_TIMEOUT_SECONDS = 6  # start-to-close = 6 + 5 s grace: how long the lost attempt waits


@pytest.mark.timeout(180)
async def test_worker_sigkilled_mid_step_restarts_and_publishes_exactly_once(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    sink = tmp_path / "data" / "sinks" / "acme" / "records.jsonl"
    attempts = tmp_path / "attempts.jsonl"
    env = worker_env(client, settings, tmp_path / "data")
    record = {"sku": "A-1", "price": 9.5}
    pipeline = {
        "name": "kill-restart",
        "tenant": "acme",
        "inputs": {"record": record},
        "steps": [
            publish_step(
                "publish",
                "${{ inputs.record }}",
                "records.jsonl",
                timeout_seconds=STEP_TIMEOUT_SECONDS,
            )
        ],
        "output": {"published": "${{ steps.publish.status }}"},
    }
    first = slow_publish_worker(attempts, HOLD_SECONDS, env, tmp_path / "worker-1.log")
    second: WorkerProcess | None = None
    try:
        started = await start_pipeline(client, settings, pipeline)
        handle = client.get_workflow_handle(started.id, result_type=PipelineResult)
        key = f"{handle.id}/publish"
        await wait_until(
            lambda: any(a["key"] == key and a["attempt"] == 1 for a in read_jsonl(attempts)),
            "attempt 1 of the step to write and start holding",
            timeout=90,
        )
        assert first.kill() == -signal.SIGKILL
        second = slow_publish_worker(attempts, HOLD_SECONDS, env, tmp_path / "worker-2.log")
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        except TimeoutError:
            raise AssertionError(
                f"pipeline did not finish; worker 2 said:\n{second.output()}"
            ) from None
        assert second.terminate() == 0, second.output()
    finally:
        first.close()
        if second is not None:
            second.close()

    assert result.status == "succeeded", result
    assert result.steps["publish"].attempts == 2
    assert result.steps["publish"].outputs["duplicate"] is True

    # The history shows the retry: the completed attempt is the 2nd, and the
    # 1st was lost to the start-to-close timeout (the worker was gone).
    started_events = [
        e.activity_task_started_event_attributes
        for e in await history.events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert [a.attempt for a in started_events] == [2]
    last_failure = started_events[0].last_failure
    assert last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE
    assert await history.workflow_task_failures(handle) == 0

    # The side effect happened once; both attempts carried the same key.
    lines = [r for r in read_jsonl(sink) if r["idempotency_key"] == key]
    assert [(r["record"], r["tenant"]) for r in lines] == [(record, "acme")]
    tries = [a for a in read_jsonl(attempts) if a["key"] == key]
    assert [(a["attempt"], a["duplicate"]) for a in tries] == [(1, False), (2, True)]
    assert tries[0]["pid"] == first.pid
    assert second is not None and tries[1]["pid"] == second.pid
