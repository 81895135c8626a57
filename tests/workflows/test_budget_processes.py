"""Budgets stay exact with three worker processes under load.

A pipeline's budget is one ledger per pipeline (the key), split into shares
for its ``for_each`` chunks. Here three ``aiworker worker`` processes run
three pipelines at once, each a ``for_each`` of web-scrape calls against a
loopback site with its own ``max_external_calls``; their chunks land on
every process. The site counts what really arrived, so the test sees spend
that no ledger reports: no pipeline overspends, every admitted item is one
request, every other item is accounted as ``budget_exceeded``, nothing is
lost and nothing runs twice.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.loopback import Exchange, Loopback
from support.pipelines import pipeline_result
from support.processes import served_by, worker_processes
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names

ITEMS = 40
CHUNK = 5  # 8 chunks per pipeline, so the chunks spread over the processes
# pipeline -> max_external_calls: two budgets below the items (split evenly over
# the 8 chunks, so the exact figure is the budget itself) and one above them.
BUDGETS = {"p0": 8, "p1": 16, "p2": 48}
QUEUES = (
    (names.PIPELINES_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
    (names.SCRAPE_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
)


class _Site:
    """Pages ``/<pipeline>/<item>``; counts every request that arrives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()

    def handle(self, ex: Exchange) -> None:
        parts = ex.target.strip("/").split("/")
        if len(parts) != 2:
            return ex.send(404, b"", None)
        with self.lock:
            self.hits[ex.target] += 1
        ex.stopping.wait(0.02)  # long enough for items of several chunks to overlap
        ex.send(200, f"<html><body><h1>{parts[0]} {parts[1]}</h1></body></html>".encode())

    def of(self, pipeline: str) -> Counter[str]:
        with self.lock:
            return Counter({k: v for k, v in self.hits.items() if k.startswith(f"/{pipeline}/")})


def pipeline(name: str, budget: int, server: Loopback) -> dict[str, Any]:
    return {
        "name": f"budget-{name}",
        "tenant": "acme",
        "budget": {"max_external_calls": budget},
        "inputs": {"items": list(range(ITEMS))},
        "steps": [
            {
                "id": "pages",
                "worker": names.WEB_SCRAPE,
                "for_each": "${{ inputs.items }}",
                "chunk_size": CHUNK,
                "max_parallel": 16,
                "input": {
                    "url": server.url(f"/{name}/" + "${{ item }}"),
                    "extraction_spec": {"fields": {"h1": {"selector": "h1"}}},
                    "respect_robots": False,
                },
            }
        ],
    }


async def _json_result(handle: Any) -> dict[str, Any]:
    """A run's result as JSON, whether it completed or failed carrying it."""
    return (await pipeline_result(handle)).model_dump(mode="json")


async def chunk_ids(client: Client, workflow_id: str) -> list[str]:
    """The for_each chunks the pipeline started (its child workflows)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


# start-up (support.processes.READY_SECONDS) plus the pipelines' 180 s, with room
@pytest.mark.timeout(420)
async def test_budgets_stay_exact_across_three_worker_processes(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    site = _Site()
    server = Loopback(site.handle).start()
    try:
        async with worker_processes(
            client,
            settings,
            tmp_path,
            3,
            env={"AIWORKER_RATE_LIMITS": f"{names.WEB_SCRAPE}:*=100000/min"},
            queues=QUEUES,
        ) as procs:
            queue = settings.queue(names.PIPELINES_QUEUE)
            handles = {
                name: await client.start_workflow(
                    names.PIPELINE_WORKFLOW,
                    pipeline(name, budget, server),
                    id=f"budget-{name}-{uuid.uuid4().hex[:8]}",
                    task_queue=queue,
                )
                for name, budget in BUDGETS.items()
            }
            results = dict(
                zip(
                    handles,
                    await asyncio.wait_for(
                        asyncio.gather(*(_json_result(h) for h in handles.values())), 180
                    ),
                    strict=True,
                )
            )
            served: Counter[str] = Counter()
            for h in handles.values():
                for chunk in await chunk_ids(client, h.id):
                    served += await served_by(client, chunk)
    finally:
        server.stop()

    for name, budget in BUDGETS.items():
        result, hits = results[name], site.of(name)
        expected = min(budget, ITEMS)
        # no page was asked for twice (no replayed or duplicated call) ...
        assert set(hits.values()) <= {1}, (name, hits)
        # ... and exactly the budget arrived at the site: no overspend, no share lost
        assert sum(hits.values()) == expected, (name, sum(hits.values()), result)
        pages = result["steps"]["pages"]
        assert result["usage"]["external_calls"] == expected, (name, result["usage"])
        # every item accounted for: it ran, or it was refused by the budget
        assert pages["items"] == {
            "total": ITEMS,
            "succeeded": expected,
            "failed": ITEMS - expected,
        }, (name, pages["items"])
        assert {e["error_code"] for e in pages["outputs"]["errors"]} <= {"budget_exceeded"}
        assert len(pages["outputs"]["items"]) == ITEMS
        ran = {i for i, out in enumerate(pages["outputs"]["items"]) if out is not None}
        assert {f"/{name}/{i}" for i in ran} == set(hits), name
        if budget < ITEMS:
            assert result["status"] == "budget_exhausted", (name, result["status"])
            assert result["error"]["code"] == "budget_exceeded"
        else:
            assert result["status"] == "succeeded", (name, result["status"], result["error"])

    # the load was really shared: chunks' tasks ran in more than one process
    pids = {identity.split("@", 1)[0] for identity in served}
    assert pids <= {str(p.pid) for p in procs}, served
    assert len(pids) >= 2, served
