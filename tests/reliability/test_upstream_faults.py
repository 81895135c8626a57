"""An upstream that fails: retries absorb 50% 5xx; at 100% the breaker opens,
calls stop reaching the upstream, and traffic resumes after recovery.

The upstream is a real HTTP server on loopback that counts every request it
receives. The step's worker is a stand-in (``UpstreamGet`` under
``STANDIN_ID``) that GETs through httpx with the real ``BreakerRegistry``,
run by the real runtime with Temporal's retries; its Temporal options are
those of the real spec of ``STANDIN_ID``. When ``web-scrape`` is on main the
step becomes a web-scrape step and the tool its ``fetch_url``.

The breaker runs on a manual clock, so "the open period has passed" is a
statement of the test, not a race against a busy machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conftest import Stack, running_stack
from prometheus_client import CollectorRegistry
from support import history
from support.loopback import upstream
from support.standins import (
    STANDIN_ID,
    UPSTREAM_SPEC_UPDATE,
    BreakerClient,
    UpstreamGet,
    derived_spec,
    registered,
)
from temporalio.client import Client

from activities.breaker import BreakerRegistry
from activities.metrics import WorkerMetrics
from activities.runtime import WorkerRuntime
from schemas.pipeline import PipelineResult
from schemas.settings import Settings
from schemas.spec import load_specs

THRESHOLD = 5
OPEN_SECONDS = 30.0


class ManualClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@asynccontextmanager
async def upstream_stack(
    client: Client, settings: Settings, breakers: BreakerRegistry
) -> AsyncIterator[tuple[Stack, WorkerMetrics]]:
    tool = BreakerClient(breakers)
    metrics = WorkerMetrics(CollectorRegistry())
    specs = {**load_specs(), STANDIN_ID: derived_spec(STANDIN_ID, **UPSTREAM_SPEC_UPDATE)}
    runtime = WorkerRuntime(settings, specs, tools={"fetch_url": tool}, metrics=metrics)
    try:
        with registered(UpstreamGet(), runtime):
            async with running_stack(client, settings) as stack:
                yield stack, metrics
    finally:
        await tool.aclose()


def pipeline(url: str, **step: Any) -> dict[str, Any]:
    return {
        "name": "upstream-faults",
        "inputs": {"url": url},
        "steps": [
            {"id": "get", "worker": STANDIN_ID, "input": {"url": "${{ inputs.url }}"}, **step}
        ],
        "output": {"status_code": "${{ steps.get.outputs.status_code }}"},
    }


async def run(stack: Stack, url: str, **step: Any) -> PipelineResult:
    handle = await stack.start(pipeline(url, **step))
    result: PipelineResult = await asyncio.wait_for(handle.result(), 90)
    assert await history.workflow_task_failures(handle) == 0
    return result


def calls(metrics: WorkerMetrics, error_code: str) -> float:
    labels = {"worker_id": STANDIN_ID, "status": "failed", "error_code": error_code}
    value = metrics.registry.get_sample_value(
        "aiworker_requests_total", {**labels, "tenant": "default"}
    )
    return value or 0.0


@pytest.mark.timeout(150)
async def test_half_the_requests_failing_pipelines_succeed_within_retry_budget(
    client: Client, settings: Settings
) -> None:
    breakers = BreakerRegistry("host", failure_threshold=THRESHOLD, clock=ManualClock())
    n = 12
    # At most 4 pipelines in flight: each fails once before it succeeds, so at
    # most 4 failures fall between two successes (which reset the breaker's
    # count) and the breaker, at 5, stays closed: this is the retry path alone.
    in_flight = asyncio.Semaphore(THRESHOLD - 1)
    with upstream("alternate") as up:
        async with upstream_stack(client, settings, breakers) as (stack, _metrics):

            async def one(i: int) -> PipelineResult:
                async with in_flight:
                    return await run(stack, f"{up.base_url}/item/{i}")

            results = await asyncio.gather(*(one(i) for i in range(n)))
        target = BreakerClient.target(up.base_url)
        assert breakers.state(target) == "closed"
        assert up.by_status == {503: n, 200: n}

    budget = load_specs()[STANDIN_ID].retries.max_attempts
    for r in results:
        assert r.status == "succeeded", r
        assert r.output == {"status_code": 200}
        assert r.steps["get"].attempts == 2 <= budget


@pytest.mark.timeout(150)
async def test_dead_upstream_opens_breaker_calls_stop_then_resume_after_recovery(
    client: Client, settings: Settings
) -> None:
    clock = ManualClock()
    breakers = BreakerRegistry(
        "host", failure_threshold=THRESHOLD, open_seconds=OPEN_SECONDS, clock=clock
    )
    once = {"retry": {"max_attempts": 1}}
    with upstream("down") as up:
        target = BreakerClient.target(up.base_url)
        async with upstream_stack(client, settings, breakers) as (stack, metrics):
            # 1. Every request fails: the breaker opens at the threshold.
            for i in range(THRESHOLD):
                assert breakers.state(target) == "closed"
                r = await run(stack, f"{up.base_url}/down/{i}", **once)
                assert (r.status, r.steps["get"].error_code) == ("failed", "fetch_failed")
            assert breakers.state(target) == "open"
            assert up.total == THRESHOLD

            # 2. While it is open, calls fail fast and never reach the upstream.
            blocked = await asyncio.gather(
                *(run(stack, f"{up.base_url}/blocked/{i}", **once) for i in range(10))
            )
            assert {(r.status, r.steps["get"].error_code) for r in blocked} == {
                ("failed", "circuit_open")
            }
            assert up.total == THRESHOLD
            assert calls(metrics, "circuit_open") == 10
            assert calls(metrics, "fetch_failed") == THRESHOLD

            # 3. The upstream recovers; after the open period one probe closes the
            # breaker and traffic flows again.
            up.mode = "up"
            clock.advance(OPEN_SECONDS)
            assert breakers.state(target) == "half_open"
            probe = await run(stack, f"{up.base_url}/probe")
            assert (probe.status, probe.steps["get"].attempts) == ("succeeded", 1)
            assert breakers.state(target) == "closed"
            resumed = await asyncio.gather(
                *(run(stack, f"{up.base_url}/after/{i}") for i in range(10))
            )
            assert all(r.status == "succeeded" for r in resumed)
            assert up.total == THRESHOLD + 1 + 10
            assert up.by_status[200] == 11
