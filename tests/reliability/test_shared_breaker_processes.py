"""A breaker opened by one worker process makes the other fail fast.

Two real ``aiworker worker`` processes on the session's Temporal server and a
loopback upstream that answers 503 to every request and counts them.
Process A alone runs scrapes of the upstream until its host breaker opens and
the opening reaches the target's ``SharedBreakerWorkflow``. Then process B
starts and A drains and exits, so B is the only process that can take the
next activity. B has never called the upstream and its own breaker is closed,
yet the next scrape's first attempt fails fast with ``circuit_open`` without
a request reaching the upstream; after the open period its retry is the one
half-open probe across processes: it probes the upstream once, the step ends
with the upstream's error, and the probe's failure re-opens the breaker.

robots.txt is off for these steps so that every request counted is a page
request.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import history
from support.loopback import upstream
from support.pipelines import pipeline_json, scrape_pipeline
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle

from aiworker.config.settings import Settings
from aiworker.schemas import names

AIWORKER = str(Path(sys.executable).parent / "aiworker")
THRESHOLD = 2
# Long enough for B to start and A to drain on a busy machine before the
# opening runs out; the test checks that it did not.
OPEN_SECONDS = 15.0


def scrape(url: str) -> dict[str, Any]:
    return scrape_pipeline("shared-breaker", url, THRESHOLD)


async def pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> list[str]:
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return [p.identity for p in resp.pollers]


async def polls_everything(client: Client, settings: Settings, pid: int) -> bool:
    """The process ``pid`` polls both queues this test needs (identity ``pid@host``)."""
    for queue, kind in (
        (names.PIPELINES_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        (names.SCRAPE_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        ids = await pollers(client, settings.queue(queue), kind)
        if not any(i.startswith(f"{pid}@") for i in ids):
            return False
    return True


def log_events(log: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one ``event`` in a process's log, in order."""
    out = []
    for line in log.read_text("utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == event:
            out.append(doc)
    return out


def attempts_logged(log: Path, workflow_id: str) -> list[tuple[int, str | None, str]]:
    """(attempt, error code, error message) of each web-scrape attempt in a process's log."""
    return sorted(
        (doc["attempt"], doc.get("error_code"), doc.get("error", ""))
        for doc in log_events(log, "worker_call")
        if doc.get("workflow_id") == workflow_id
    )


def breaker_transitions(log: Path) -> list[tuple[str, str]]:
    """(from, to) of each breaker transition in a process's log."""
    return [(doc["from"], doc["to"]) for doc in log_events(log, "breaker_state")]


@pytest.mark.timeout(170)
async def test_breaker_opened_by_one_process_makes_the_other_fail_fast(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    env = worker_env(client, settings, tmp_path / "data")
    env.update(
        AIWORKER_RATE_LIMITS=f"{names.WEB_SCRAPE}:*=100000/min",
        AIWORKER_BREAKER_FAILURE_THRESHOLD=str(THRESHOLD),
        AIWORKER_BREAKER_OPEN_SECONDS=str(OPEN_SECONDS),
    )
    queue = settings.queue(names.PIPELINES_QUEUE)
    procs: list[WorkerProcess] = []

    async def start(path: str) -> WorkflowHandle[Any, Any]:
        return await client.start_workflow(
            names.PIPELINE_WORKFLOW,
            scrape(f"{up.base_url}{path}"),
            id=f"shared-breaker{path.replace('/', '-')}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
        )

    async def result(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
        try:
            r: dict[str, Any] = await asyncio.wait_for(pipeline_json(handle), 90)
        except TimeoutError:
            for p in procs:
                print(p.output())
            raise
        assert await history.workflow_task_failures(handle) == 0
        return r

    with upstream("down") as up:
        host = up.base_url.split("://", 1)[1]
        breaker = client.get_workflow_handle(
            names.shared_breaker_workflow_id(f"host:{host}", settings.task_queue_suffix)
        )
        try:
            # 1. Only A runs: the upstream's failures open A's breaker for the host.
            a = WorkerProcess([AIWORKER, "worker"], env, tmp_path / "worker-a.log")
            procs.append(a)
            first = await result(await start("/a"))
            step = first["steps"]["get"]
            assert (first["status"], step["error_code"], step["attempts"]) == (
                "failed",
                "fetch_failed",
                THRESHOLD,
            )
            assert up.total == THRESHOLD

            async def published() -> float:
                try:
                    until = await breaker.query(names.BREAKER_STATE_QUERY, result_type=float)
                except Exception:
                    return 0.0
                return until if until > time.time() else 0.0

            until = await wait_until(
                published, "A's opening in the SharedBreakerWorkflow", timeout=15
            )
            assert until <= time.time() + OPEN_SECONDS

            # 2. B starts; A drains and exits: B alone can take the next activity.
            b = WorkerProcess([AIWORKER, "worker"], env, tmp_path / "worker-b.log")
            procs.append(b)
            await wait_until(
                lambda: polls_everything(client, settings, b.pid),
                "B polling its queues",
                timeout=60,
            )
            await asyncio.to_thread(a.terminate)
            assert a.proc.poll() is not None
            assert until - time.time() > 3, (
                f"the opening ran out before B was ready ({until - time.time():.1f}s left); "
                "the machine is slower than OPEN_SECONDS allows for"
            )

            handle = await start("/b")

            async def failed_fast() -> Any:
                desc = await handle.describe()
                for p in desc.raw_description.pending_activities:
                    if p.last_failure.application_failure_info.type:
                        return p
                if desc.status is not None and desc.status.name != "RUNNING":
                    raise AssertionError(f"pipeline ended before its retry was seen: {desc}")
                return None

            # B's first attempt failed fast, and the upstream saw nothing new.
            pending = await wait_until(failed_fast, "the first attempt's failure", timeout=30)
            assert pending.last_failure.application_failure_info.type == "circuit_open"
            assert "another worker process" in pending.last_failure.message
            assert pending.last_worker_identity.startswith(f"{b.pid}@")
            assert pending.attempt == 2  # the retry is scheduled, not yet run
            assert up.total == THRESHOLD
            assert up.by_path["/b"] == 0

            # 3. After the open period the retry probes the upstream once and fails with it.
            second = await result(handle)
            step = second["steps"]["get"]
            assert (second["status"], step["error_code"], step["attempts"]) == (
                "failed",
                "fetch_failed",
                2,
            )
            assert up.total == THRESHOLD + 1
            assert up.by_path["/b"] == 1

            events = await history.events(handle)
            started = [
                e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            ]
            assert len(started) == 1
            attrs = started[0].activity_task_started_event_attributes
            assert (attrs.attempt, attrs.identity.split("@")[0]) == (2, str(b.pid))
            # the retry waited for the opening to run out (the server's clock, same machine)
            assert started[0].event_time.ToDatetime().timestamp() >= until - 1.0
            assert await history.activity_failures(handle) == [("fetch_failed", 0)]

            # B's own record of both attempts; A never saw this pipeline.
            logged = attempts_logged(b.log, handle.id)
            assert [(n, code) for n, code, _ in logged] == [
                (1, "circuit_open"),
                (2, "fetch_failed"),
            ], logged
            assert "another worker process" in logged[0][2]
            assert attempts_logged(a.log, handle.id) == []
            assert "breaker.open" in a.log.read_text("utf-8", errors="replace")
            # B's retry was the half-open probe across processes (it held the probe
            # lease): its failure re-opened the breaker, for every process, although one
            # failure is below B's own threshold
            transitions = breaker_transitions(b.log)
            assert transitions == [("closed", "half_open"), ("half_open", "open")], transitions
        finally:
            for p in procs:
                p.terminate()
                p.close()
