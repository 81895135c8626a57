"""An upstream that fails: retries absorb 50% 5xx; at 100% the breaker opens,
calls stop reaching the upstream, and traffic resumes after recovery.

The real ``web-scrape`` worker (its ``fetch_url`` tool, the real
``BreakerRegistry`` per host:port, Temporal's retries under the real spec)
against a real HTTP server on loopback that counts every request it receives.
robots.txt is off for these steps so that every request counted is a page
request.

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
from support import history
from support.loopback import upstream
from support.pipelines import pipeline_result
from temporalio.client import Client

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.tools import scrape_tools
from aiworker.config.catalog import load_specs
from aiworker.config.settings import RateLimitRule, Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult

THRESHOLD = 5
OPEN_SECONDS = 30.0
WORKER = names.WEB_SCRAPE


class ManualClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@asynccontextmanager
async def scrape_stack(
    client: Client, settings: Settings, breakers: BreakerRegistry
) -> AsyncIterator[Stack]:
    # The spec's per-tenant rate limit (10/min) would make this a test of the limiter.
    unlimited = RateLimitRule(worker_id=WORKER, tenant="*", limit=100_000, period_seconds=1)
    settings = settings.model_copy(update={"rate_limits": (unlimited,)})
    tools = scrape_tools(settings, breakers=breakers)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            yield stack
    finally:
        await tools["fetch_url"].aclose()


def pipeline(url: str, **step: Any) -> dict[str, Any]:
    return {
        "name": "upstream-faults",
        "inputs": {"url": url},
        "steps": [
            {
                "id": "get",
                "worker": WORKER,
                "input": {
                    "url": "${{ inputs.url }}",
                    "extraction_spec": {"fields": {"h1": {"selector": "h1", "required": True}}},
                    "respect_robots": False,
                },
                **step,
            }
        ],
        "output": {"h1": "${{ steps.get.outputs.data.h1 }}"},
    }


async def run(stack: Stack, url: str, **step: Any) -> PipelineResult:
    handle = await stack.start(pipeline(url, **step))
    result: PipelineResult = await asyncio.wait_for(pipeline_result(handle), 90)
    assert await history.workflow_task_failures(handle) == 0
    return result


def target(base_url: str) -> str:
    return base_url.split("://", 1)[1]


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
        async with scrape_stack(client, settings, breakers) as stack:

            async def one(i: int) -> PipelineResult:
                async with in_flight:
                    return await run(stack, f"{up.base_url}/item/{i}")

            results = await asyncio.gather(*(one(i) for i in range(n)))
        assert breakers.state(target(up.base_url)) == "closed"
        assert up.by_status == {503: n, 200: n}

    budget = load_specs()[WORKER].retries.max_attempts
    for i, r in enumerate(results):
        assert r.status == "succeeded", r
        assert r.output == {"h1": f"/item/{i}"}
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
        host = target(up.base_url)
        async with scrape_stack(client, settings, breakers) as stack:
            # 1. Every request fails: the breaker opens at the threshold.
            for i in range(THRESHOLD):
                assert breakers.state(host) == "closed"
                r = await run(stack, f"{up.base_url}/down/{i}", **once)
                assert (r.status, r.steps["get"].error_code) == ("failed", "fetch_failed")
            assert breakers.state(host) == "open"
            assert up.total == THRESHOLD

            # 2. While it is open, calls fail fast and never reach the upstream.
            blocked = await asyncio.gather(
                *(run(stack, f"{up.base_url}/blocked/{i}", **once) for i in range(10))
            )
            assert {(r.status, r.steps["get"].error_code) for r in blocked} == {
                ("failed", "circuit_open")
            }
            assert up.total == THRESHOLD

            # 3. The upstream recovers; after the open period one probe closes the
            # breaker and traffic flows again.
            up.mode = "up"
            clock.advance(OPEN_SECONDS)
            assert breakers.state(host) == "half_open"
            probe = await run(stack, f"{up.base_url}/probe")
            assert (probe.status, probe.steps["get"].attempts) == ("succeeded", 1)
            assert breakers.state(host) == "closed"
            resumed = await asyncio.gather(
                *(run(stack, f"{up.base_url}/after/{i}") for i in range(10))
            )
            assert all(r.status == "succeeded" for r in resumed)
            assert up.total == THRESHOLD + 1 + 10
            assert up.by_status[200] == 11
