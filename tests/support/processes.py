"""Several ``aiworker worker`` processes on the test's server and queues, at once.

The tests that check what holds *across* worker processes (limits, budgets,
breakers under load) start N real processes with :func:`worker_processes`
and get them back only once every one polls the queues the test needs, so a
test never races a process that is still importing. Each process is a
:class:`support.procs.WorkerProcess` (stopped by its PID, never by name);
its log is kept under the test's ``tmp_path`` and printed if the block fails.

:func:`served_by` reads from a workflow's history which process ran each
activity task and workflow task (the ``identity``, ``pid@host``), so a test
can show the load was really spread over the processes.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    GetWorkflowExecutionHistoryRequest,
)
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until

AIWORKER = str(Path(sys.executable).parent / "aiworker")

# How long N processes get, together, to poll. Not a start-up time: a new build's
# first poller of a queue can wait out a whole long poll (about 60 s) when its
# version's registration meets the deployment's version workflow closing (another
# process of the build made it current a moment before: the server answers
# "workflow is closing", ResourceExhausted, and matching backs off). Seen here
# 2 times in 4 with three processes beside a CPU hog (the third queue-poll at 61
# and 64 s, the others at 10 s); sdk-python's own tests wait for the same delay.
READY_SECONDS = 150.0

# What every process must poll before it counts as up: the pipelines' workflow
# queue (every pipeline starts there) and its activity side (worker calls).
DEFAULT_QUEUES: tuple[tuple[str, TaskQueueType.ValueType], ...] = (
    (names.PIPELINES_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
    (names.PIPELINES_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
)


async def poller_identities(client: Client, queue: str, kind: TaskQueueType.ValueType) -> list[str]:
    """The identities (``pid@host``) that polled ``queue`` of ``kind`` lately."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return [p.identity for p in resp.pollers]


async def polls(
    client: Client,
    settings: Settings,
    pid: int,
    queues: Iterable[tuple[str, TaskQueueType.ValueType]] = DEFAULT_QUEUES,
) -> bool:
    """The process ``pid`` polls every one of ``queues`` (base names)."""
    for queue, kind in queues:
        ids = await poller_identities(client, settings.queue(queue), kind)
        if not any(i.startswith(f"{pid}@") for i in ids):
            return False
    return True


@asynccontextmanager
async def worker_processes(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    n: int,
    env: Mapping[str, str] | None = None,
    queues: Iterable[tuple[str, TaskQueueType.ValueType]] = DEFAULT_QUEUES,
    ready_timeout: float = READY_SECONDS,
) -> AsyncIterator[list[WorkerProcess]]:
    """``n`` ``aiworker worker`` processes, each polling ``queues``, stopped on exit.

    Args:
        client, settings: the test's server and queue family (``worker_env``).
        tmp_path: holds the shared data directory and one log per process.
        n: how many processes.
        env: settings added to (or overriding) the processes' environment.
        queues: (base queue, kind) pairs each process must poll before the
            block runs.
        ready_timeout: seconds for all of them to poll (one deadline for all).
    """
    base = worker_env(client, settings, tmp_path / "data")
    base.update(env or {})
    procs: list[WorkerProcess] = []
    wanted = tuple(queues)
    ok = False
    try:
        for i in range(n):
            procs.append(WorkerProcess([AIWORKER, "worker"], base, tmp_path / f"worker{i}.log"))
        deadline = time.monotonic() + ready_timeout
        for p in procs:

            async def up(p: WorkerProcess = p) -> bool:
                # an exited process ends the wait at once (the check below says why)
                return p.proc.poll() is not None or await polls(client, settings, p.pid, wanted)

            await wait_until(
                up,
                f"worker process {p.pid} to poll its queues (log {p.log})",
                timeout=max(deadline - time.monotonic(), 1.0),
                interval=0.2,
            )
            if p.proc.poll() is not None:
                raise AssertionError(f"worker process {p.pid} exited: {p.output()}")
        yield procs
        ok = True
    finally:
        for p in procs:
            if not ok:
                print(f"--- worker process {p.pid} ---\n{p.output()}")
            p.terminate()
            p.close()


async def served_by(client: Client, workflow_id: str, run_id: str = "") -> Counter[str]:
    """How many activity and workflow tasks of one run each process (identity) started."""
    seen: Counter[str] = Counter()
    token = b""
    while True:
        resp = await client.workflow_service.get_workflow_execution_history(
            GetWorkflowExecutionHistoryRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                next_page_token=token,
            )
        )
        for e in resp.history.events:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                seen[e.activity_task_started_event_attributes.identity] += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                seen[e.workflow_task_started_event_attributes.identity] += 1
        token = resp.next_page_token
        if not token:
            return seen


__all__ = ["AIWORKER", "poller_identities", "polls", "served_by", "worker_processes"]
