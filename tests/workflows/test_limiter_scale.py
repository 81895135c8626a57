"""The limiter at load: rate and concurrency limits stay exact with three worker
processes, whether permits come from leased blocks (a limit high for its period)
or one by one from the limiter's queue (a tight limit); nothing is dropped."""

from __future__ import annotations

import asyncio
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.history import grant_times
from support.loopback import InFlight, Loopback
from support.procs import WorkerProcess, worker_env
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from aiworker.activities.limits import BLOCK_MAX, block_size
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workflows.limits import _used

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def test_block_size_only_for_limits_high_for_their_period() -> None:
    assert block_size(10, 60.0) == (0, 0.0)  # 10/min: every request queues, in order
    assert block_size(100, 60.0) == (0, 0.0)
    assert block_size(6_000, 60.0) == (250, 5.0)  # half of what 5 s allows
    assert block_size(10**8, 60.0) == (BLOCK_MAX, 5.0)
    count, ttl = block_size(150, 3.0)  # 50/s: small blocks, valid a tenth of the period
    assert (count, ttl) == (7, pytest.approx(0.3))


def test_leased_blocks_never_put_more_than_the_limit_in_any_window() -> None:
    """The limiter's rule (grant a block of k at t only if every grant or block
    still reaching into (t - period, t] plus k stays within the limit) against
    the worst a process may do: use each permit anywhere in [t, t + ttl]."""
    rng = random.Random(29)
    for _ in range(200):
        limit, period = rng.randint(5, 60), rng.choice([1.0, 2.0, 10.0])
        grants: list[float] = []
        blocks: list[tuple[float, int, float]] = []
        used: list[float] = []
        t = 0.0
        for _ in range(300):
            t += rng.expovariate(20.0)
            k, ttl = rng.randint(1, 8), rng.uniform(0.0, period / 2)
            room = limit - _used(grants, blocks, t - period)
            if rng.random() < 0.3:  # a single queued grant, used at once
                if room >= 1:
                    grants.append(t)
                    used.append(t)
            elif room >= 1:
                k = min(k, room)
                blocks.append((t, k, ttl))
                used += [t + rng.uniform(0.0, ttl) for _ in range(k)]
        used.sort()
        for i in range(len(used) - limit):
            assert used[i + limit] - used[i] >= period, (limit, period, used[i : i + limit + 1])


async def _histories(client: Client, wid: str) -> list[WorkflowHistory]:
    """A run's history and those of its child workflows at any depth."""
    out, pending = [], [wid]
    while pending:
        history = await client.get_workflow_handle(pending.pop()).fetch_history()
        out.append(history)
        for e in history.events:
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                pending.append(
                    e.start_child_workflow_execution_initiated_event_attributes.workflow_id
                )
    return out


def _identities(histories: list[WorkflowHistory]) -> set[str]:
    return {
        e.workflow_task_completed_event_attributes.identity
        for h in histories
        for e in h.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    }


def _assert_window(times: list[float], limit: int, period: float) -> None:
    """Never more than ``limit`` grants in any window of ``period`` seconds."""
    times = sorted(times)
    for i in range(len(times) - limit):
        assert times[i + limit] - times[i] >= period, (i, times[i : i + limit + 1])


def _each(tenant: str, n: int, parallel: int) -> dict[str, Any]:
    return {
        "name": "limiter-scale",
        "tenant": tenant,
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "max_parallel": parallel,
                "chunk_size": 40,
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            }
        ],
        "output": {"succeeded": "${{ steps.each.outputs.succeeded }}"},
    }


@pytest.mark.timeout(300)
async def test_limits_hold_exactly_with_three_worker_processes_under_load(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    fast, slow = f"fast-{run}", f"slow-{run}"
    fast_limit, fast_period = 150, 3.0  # 50/s: permits in leased blocks
    slow_limit, slow_period = 6, 2.0  # 3/s: every permit queued at the limiter
    site = InFlight(hold=0.4)
    server = Loopback(site.handle).start()
    env = worker_env(client, settings, tmp_path / "data")
    env["AIWORKER_RATE_LIMITS"] = (
        f"validator:{fast}={fast_limit}/{int(fast_period)}s,"
        f"validator:{slow}={slow_limit}/{int(slow_period)}s,web-scrape:*=100000/min"
    )
    scrape = {
        "name": "limiter-scale-conc",
        "tenant": f"conc-{run}",
        "inputs": {"items": list(range(12))},
        "steps": [
            {
                "id": "each",
                "worker": "web-scrape",
                "for_each": "${{ inputs.items }}",
                "max_parallel": 12,
                "chunk_size": 4,
                "concurrency": {"key": "c1", "limit": 3},
                "input": {
                    "url": server.url("/slow?k=c1&i=${{ item }}"),
                    "extraction_spec": {"fields": {"t": {"selector": "h1"}}},
                },
            }
        ],
    }
    procs: list[WorkerProcess] = []
    try:
        for i in range(3):
            procs.append(WorkerProcess([AIWORKER, "worker"], env, tmp_path / f"worker{i}.log"))
        queue = settings.queue(names.PIPELINES_QUEUE)
        runs: list[tuple[str, dict[str, Any], int]] = [
            *((f"lim-fast-{run}-{i}", _each(fast, 160, 80), 160) for i in range(3)),
            *((f"lim-slow-{run}-{i}", _each(slow, 8, 8), 8) for i in range(3)),
            (f"lim-conc-{run}", scrape, 12),
        ]
        handles = [
            await client.start_workflow(names.PIPELINE_WORKFLOW, spec, id=wid, task_queue=queue)
            for wid, spec, _ in runs
        ]
        try:
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 240)
        except TimeoutError:
            for p in procs:
                print(p.output())
            raise
        # nothing dropped: every item of every run succeeded
        for (wid, _, n), result in zip(runs, results, strict=True):
            assert result["status"] == "succeeded", (wid, result)
            assert result["steps"]["each"]["items"]["succeeded"] == n, (wid, result["steps"])

        fast_histories = [h for w, _, _ in runs[:3] for h in await _histories(client, w)]
        pooled, queued = [], []
        for h in fast_histories:
            p, q = grant_times(h)
            pooled += p
            queued += q
        assert len(pooled) + len(queued) == 3 * 160
        # both ways: leased blocks while the window had room, then (demand is above
        # the limit) the queue, which goes first once anything waits in it
        assert pooled and queued, (len(pooled), len(queued))
        _assert_window(pooled + queued, fast_limit, fast_period)
        # the limit was what held them back: 480 permits took at least 3 full windows
        times = sorted(pooled + queued)
        assert times[-1] - times[0] >= 3 * fast_period - 0.5
        # the chunks ran in more than one process
        assert len(_identities(fast_histories)) >= 2, _identities(fast_histories)

        slow_times: list[float] = []
        for w, _, _ in runs[3:6]:
            for h in await _histories(client, w):
                p, q = grant_times(h)
                assert p == []  # a tight limit never leases blocks
                slow_times += q
        assert len(slow_times) == 24
        _assert_window(slow_times, slow_limit, slow_period)

        # the concurrency key: never more than its limit in flight, and the limit reached
        assert site.hits == 12
        assert site.peak == {"c1": 3}, site.peak
    finally:
        for p in procs:
            p.terminate()
            p.close()
        server.stop()


@pytest.mark.timeout(180)
async def test_limits_hold_across_the_limiters_continue_as_new(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limiter that continues as new every few dozen events carries its queue,
    grants and leased blocks: the window stays exact across runs, nothing is lost."""
    from conftest import running_stack
    from support.payloads import stack_settings

    from aiworker.config.settings import parse_rate_limits
    from aiworker.workflows import limits as limiter_module

    monkeypatch.setattr(limiter_module, "_MAX_HISTORY_EVENTS", 40)
    run = uuid.uuid4().hex[:6]
    queued, blocks = f"q-{run}", f"b-{run}"
    rules = f"validator:{queued}=5/1s,validator:{blocks}=300/3s"
    settings = stack_settings(tmp_path, rate_limits=tuple(parse_rate_limits(rules)))
    async with running_stack(client, settings) as stack:
        handles = [
            await stack.start(_each(queued, 30, 30), id=f"can-q-{run}"),
            await stack.start(_each(blocks, 400, 100), id=f"can-b-{run}"),
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 150)
    for h, n, result in zip(handles, (30, 400), results, strict=True):
        outcome = result if isinstance(result, dict) else result.model_dump(mode="json")
        assert outcome["status"] == "succeeded", outcome
        assert outcome["steps"]["each"]["items"]["succeeded"] == n
        pooled, granted = [], []
        for history in await _histories(client, h.id):
            p, q = grant_times(history)
            pooled += p
            granted += q
        assert len(pooled) + len(granted) == n
        limit, period = (5, 1.0) if n == 30 else (300, 3.0)
        _assert_window(pooled + granted, limit, period)
    # both limiters continued as new, more than once
    for key in (f"rate:validator:{queued}", f"rate:validator:{blocks}"):
        wid = names.limiter_workflow_id(key, settings.task_queue_suffix)
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{wid}'")]
        assert len(runs) >= 2, (key, len(runs))
