"""Limits that hold across worker processes: per-tenant rate limits and
per-key concurrency, kept by LimiterWorkflow in Temporal itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support import history
from support.loopback import InFlight, Loopback
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.activities.limits import rate_limit_for
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas import names
from aiworker.schemas.protocol import Observability, WorkerResponse

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def one_step(tenant: str, i: int) -> dict[str, Any]:
    return {
        "name": f"rl-{tenant}",
        "tenant": tenant,
        "inputs": {"i": i},
        "steps": [
            {
                "id": "v",
                "worker": "validator",
                "input": {"data": "${{ inputs.i }}", "schema": {"type": "integer"}},
            }
        ],
    }


async def permitted_at(client: Client, wid: str) -> float:
    """When the limiter's permit reached the pipeline (the grant, as history saw it)."""
    h = client.get_workflow_handle(wid)
    async for e in h.fetch_history_events():
        if (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == names.PERMIT_SIGNAL
        ):
            return e.event_time.ToDatetime().timestamp()
    raise AssertionError(f"{wid}: no permit received")


async def called_at(client: Client, wid: str) -> float:
    """When the pipeline's worker call was recorded: its activity scheduled, or its
    local activity's marker (the validator runs local)."""
    h = client.get_workflow_handle(wid)
    async for e in h.fetch_history_events():
        local = history.local_activity_type(e)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED or (
            history.is_worker(local)
        ):
            return e.event_time.ToDatetime().timestamp()
    raise AssertionError(f"{wid}: no worker called")


def test_rate_limit_rules_precedence() -> None:
    specs = load_specs()
    s = Settings(rate_limits=tuple(parse_rate_limits("validator:acme=5/min,validator:*=100/min")))
    assert rate_limit_for(s, specs, "validator", "acme") == (5, 60.0)
    assert rate_limit_for(s, specs, "validator", "other") == (100, 60.0)
    assert rate_limit_for(Settings(), specs, "validator", "acme") is None


@pytest.mark.timeout(180)
async def test_tenant_rate_limit_holds_across_two_worker_processes(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    limit, window = 5, 20.0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(
        {
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "AIWORKER_TASK_QUEUE_SUFFIX": settings.task_queue_suffix,
            "AIWORKER_METRICS_PORT": "0",
            "AIWORKER_RATE_LIMITS": f"validator:acme={limit}/{int(window)}s",
            "AIWORKER_LOG_LEVEL": "WARNING",
        }
    )
    logs = [open(tmp_path / f"worker{i}.log", "w") for i in range(2)]
    procs = [
        subprocess.Popen([AIWORKER, "worker"], env=env, stdout=log, stderr=log) for log in logs
    ]
    try:
        queue = settings.queue(names.PIPELINES_QUEUE)
        run = uuid.uuid4().hex[:6]
        acme = [f"rl-acme-{run}-{i}" for i in range(limit + 3)]
        other = [f"rl-other-{run}-{i}" for i in range(4)]
        for wid, tenant, i in [
            *((w, "acme", i) for i, w in enumerate(acme)),
            *((w, "other", i) for i, w in enumerate(other)),
        ]:
            await client.start_workflow(
                names.PIPELINE_WORKFLOW, one_step(tenant, i), id=wid, task_queue=queue
            )
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(client.get_workflow_handle(w).result() for w in acme + other)),
                timeout=120,
            )
        except TimeoutError:
            for i in range(2):
                print((tmp_path / f"worker{i}.log").read_text()[-3000:])
            raise
        assert all(r["status"] == "succeeded" for r in results), results
        acme_times = sorted([await permitted_at(client, w) for w in acme])
        other_times = sorted([await called_at(client, w) for w in other])
        # never more than `limit` acme permits inside any window (the slack covers the
        # time between the limiter's decision and the signal landing in history)
        for i in range(len(acme_times) - limit):
            assert acme_times[i + limit] - acme_times[i] >= window - 1.0, acme_times
        # the over-limit requests waited, were not lost, and the other tenant (no limit,
        # so it never asks the limiter) did not wait
        assert acme_times[limit] - acme_times[0] >= window - 1.0
        assert other_times[-1] < acme_times[limit]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for log in logs:
            log.close()


@pytest.mark.timeout(120)
async def test_concurrency_key_is_never_exceeded(client: Client, settings: Settings) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    @activity.defn(name=names.VALIDATOR)
    async def slow_validator(request: dict[str, Any]) -> WorkerResponse:
        key = request["input"]["data"]["customer"]
        running[key] = running.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), running[key])
        try:
            await asyncio.sleep(0.4)
        finally:
            running[key] -= 1
        return WorkerResponse(
            worker_id="validator",
            version="1",
            status="succeeded",
            outputs={"valid": True, "errors": []},
            observability=Observability(worker_id="validator"),
        )

    def pipeline(customer: str, n: int) -> dict[str, Any]:
        return {
            "name": "conc",
            "inputs": {"customer": customer},
            "steps": [
                {
                    "id": f"s{i}",
                    "worker": "validator",
                    "concurrency": {"key": "${{ inputs.customer }}", "limit": 2},
                    "input": {"data": {"customer": "${{ inputs.customer }}"}, "schema": {}},
                }
                for i in range(n)
            ],
        }

    # one process here (the SDK allows one worker per queue per process); the limiter
    # lives in Temporal, and the rate-limit test above proves it across processes.
    # Activities, not local ones: a 0.4 s local activity holds its pipeline's workflow
    # task, so the permit signal of its sibling step waits until it ends (peak 1).
    settings = settings.model_copy(update={"local_activities": False})
    async with running_stack(
        client, settings, replace_activities={"validator": slow_validator}
    ) as a:
        handles = [await a.start(pipeline("c1", 4)) for _ in range(2)]
        handles.append(await a.start(pipeline("c2", 3)))
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 90)
    assert all(r.status == "succeeded" for r in results)
    assert peak["c1"] == 2, peak
    assert peak["c2"] == 2, peak


@pytest.mark.timeout(180)
async def test_concurrency_key_holds_across_two_worker_processes_at_a_real_server(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    from support.procs import WorkerProcess, worker_env

    site = InFlight(hold=0.6)
    env = worker_env(client, settings, tmp_path / "data")
    env["AIWORKER_RATE_LIMITS"] = "web-scrape:*=100000/min"
    server = Loopback(site.handle).start()
    procs: list[WorkerProcess] = []

    def pipeline(customer: str, n: int) -> dict[str, Any]:
        return {
            "name": "conc-http",
            "tenant": "acme",
            "inputs": {"customer": customer},
            "steps": [
                {
                    "id": f"s{i}",
                    "worker": "web-scrape",
                    "concurrency": {"key": "${{ inputs.customer }}", "limit": 2},
                    "input": {
                        "url": server.url(f"/slow?k=${{{{ inputs.customer }}}}&i={i}"),
                        "extraction_spec": {"fields": {"t": {"selector": "h1"}}},
                    },
                }
                for i in range(n)
            ],
        }

    try:
        for i in range(2):
            procs.append(WorkerProcess([AIWORKER, "worker"], env, tmp_path / f"worker{i}.log"))
        queue = settings.queue(names.PIPELINES_QUEUE)
        handles = []
        for customer, n in (("c1", 4), ("c1", 4), ("c2", 3)):
            handles.append(
                await client.start_workflow(
                    names.PIPELINE_WORKFLOW,
                    pipeline(customer, n),
                    id=f"conc-http-{customer}-{uuid.uuid4().hex[:6]}",
                    task_queue=queue,
                )
            )
        try:
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        except TimeoutError:
            for p in procs:
                print(p.output())
            raise
        assert all(r["status"] == "succeeded" for r in results), results
        assert site.hits == 11
        # never more than the limit per key, and the limit was actually reached
        assert site.peak == {"c1": 2, "c2": 2}, site.peak
    finally:
        for p in procs:
            p.terminate()
            p.close()
        server.stop()
