"""When a shared breaker's open period ends, exactly one worker process probes.

Three real ``aiworker worker`` processes on the session's Temporal server and a
loopback upstream that fails (503) until the breaker is open, then recovers.
One scrape opens the breaker (threshold 1) and the opening reaches the
target's ``SharedBreakerWorkflow``. Then several scrapes start: each fails
fast while the target is open and retries when the open period ends, spread
over the three processes. The upstream holds the first request that reaches
it after the opening (the probe) and counts every request; the test waits
until either a second request arrived or every other scrape was refused with
"probe is in flight", and asserts that the upstream saw exactly one request.
Then the probe is answered, the breaker closes everywhere and every scrape
succeeds. On a build without the probe lease each process whose own breaker
is closed sends its calls at once, and the upstream sees several.

robots.txt is off for these steps so that every request counted is a page
request.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import history
from support.loopback import Exchange, serve
from support.pipelines import pipeline_json, scrape_pipeline
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from aiworker.config.settings import Settings
from aiworker.schemas import names

AIWORKER = str(Path(sys.executable).parent / "aiworker")
# Long enough for the scrapes to start and fail fast before the opening runs out.
OPEN_SECONDS = 12.0
SCRAPES = 6


class Recovering:
    """503 while ``down``; then every request is counted and the first one (the
    probe) is held until ``release`` is set, the others answered at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down = True
        self.down_hits = 0
        self.up_hits: list[tuple[float, str]] = []
        self.release = threading.Event()

    def handle(self, ex: Exchange) -> None:
        with self.lock:
            down = self.down
            if down:
                self.down_hits += 1
                first = False
            else:
                self.up_hits.append((time.time(), ex.path))
                first = len(self.up_hits) == 1
        if down:
            return ex.send(503, b"down")
        if first:
            while not (self.release.is_set() or ex.stopping.is_set()):
                self.release.wait(0.05)
        ex.send(200, f"<h1>{ex.path}</h1>".encode())

    def up(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.up_hits)


def scrape(url: str, attempts: int) -> dict[str, Any]:
    return scrape_pipeline("breaker-probe", url, attempts)


async def polls_everything(client: Client, settings: Settings, pid: int) -> bool:
    """The process ``pid`` polls both queues this test needs (identity ``pid@host``)."""
    for queue, kind in (
        (names.PIPELINES_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        (names.SCRAPE_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=settings.queue(queue)),
                task_queue_type=kind,
            )
        )
        if not any(p.identity.startswith(f"{pid}@") for p in resp.pollers):
            return False
    return True


async def refused_for_probe(handle: WorkflowHandle[Any, Any]) -> bool:
    """The scrape's last attempt was refused because another process probes (its
    retry pending, or its attempts spent: the spec allows two)."""
    desc = await handle.describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        pending = desc.raw_description.pending_activities
        return any("probe is in flight" in p.last_failure.message for p in pending)
    step = (await pipeline_json(handle))["steps"]["get"]
    return bool(step["error_code"] == "circuit_open" and "probe is in flight" in str(step))


@pytest.mark.timeout(240)
async def test_one_probe_across_three_processes_when_the_open_period_ends(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    env = worker_env(client, settings, tmp_path / "data")
    env.update(
        AIWORKER_BREAKER_FAILURE_THRESHOLD="1",
        AIWORKER_BREAKER_OPEN_SECONDS=str(OPEN_SECONDS),
    )
    queue = settings.queue(names.PIPELINES_QUEUE)
    target = Recovering()
    procs: list[WorkerProcess] = []

    async def start(url: str, attempts: int) -> WorkflowHandle[Any, Any]:
        return await client.start_workflow(
            names.PIPELINE_WORKFLOW,
            scrape(url, attempts),
            id=f"breaker-probe-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )

    def logs() -> str:
        return "\n".join(p.output() for p in procs)

    with serve(target.handle) as up:
        base = f"http://127.0.0.1:{up.port}"
        key = f"host:127.0.0.1:{up.port}"
        breaker = client.get_workflow_handle(
            names.shared_breaker_workflow_id(key, settings.task_queue_suffix)
        )
        try:
            for name in "abc":
                procs.append(WorkerProcess([AIWORKER, "worker"], env, tmp_path / f"{name}.log"))
            for pid in [p.pid for p in procs]:
                await wait_until(
                    lambda pid=pid: polls_everything(client, settings, pid),  # type: ignore[misc]
                    lambda pid=pid: f"worker {pid} polling its queues\n{logs()}",  # type: ignore[misc]
                    timeout=90,
                )

            # 1. One failure opens the breaker; the opening reaches the breaker workflow.
            first = await pipeline_json(await start(f"{base}/open", 1))
            assert (first["status"], first["steps"]["get"]["error_code"]) == (
                "failed",
                "fetch_failed",
            )

            async def published() -> float:
                try:
                    return await breaker.query(names.BREAKER_STATE_QUERY, result_type=float)
                except Exception:
                    return 0.0

            until = await wait_until(published, "the opening in the breaker workflow", timeout=15)

            # 2. The target recovers; scrapes start while it is open and fail fast.
            target.down = False
            handles = [await start(f"{base}/s{i}", 6) for i in range(SCRAPES)]
            assert time.time() < until, "the scrapes started after the opening ran out"

            # 3. The open period ends: one request (the probe) reaches the target and is
            # held; every other scrape is refused while it is in flight.
            async def settled() -> bool:
                hits = target.up()
                if len(hits) >= 2:
                    return True
                if not hits:
                    return False
                probe = hits[0][1]
                others = [h for i, h in enumerate(handles) if f"/s{i}" != probe]
                return all(await asyncio.gather(*(refused_for_probe(h) for h in others)))

            await wait_until(
                settled,
                lambda: f"the probe and the others' refusals (target saw {target.up()})\n{logs()}",
                timeout=60,
            )
            hits = target.up()
            assert len(hits) == 1, f"{len(hits)} requests reached the target at once: {hits}"
            assert hits[0][0] >= until - 1.0  # after the opening ran out (same machine's clock)
            assert target.down_hits == 1

            # 4. The probe succeeds: the breaker closes everywhere; new scrapes pass at once.
            target.release.set()
            prober = next(h for i, h in enumerate(handles) if f"/s{i}" == hits[0][1])
            assert (await asyncio.wait_for(prober.result(), 60))["status"] == "succeeded"

            async def closed() -> bool:
                desc = await breaker.describe()
                probe = await desc.memo_value(names.BREAKER_PROBE_MEMO_KEY, {})
                return bool(probe.get("closed"))

            await wait_until(closed, "the probe's success in the breaker workflow", timeout=15)
            after = [await start(f"{base}/after{i}", 1) for i in range(SCRAPES)]
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in after)), 120)
            assert [r["status"] for r in results] == ["succeeded"] * SCRAPES, [
                r["steps"]["get"].get("error_message") for r in results
            ]
            assert len(target.up()) == 1 + SCRAPES
            for h in handles + after:
                assert await history.workflow_task_failures(h) == 0
        finally:
            target.release.set()
            for p in procs:
                p.terminate()
                p.close()
