"""Breakers shared by worker processes: one process's failures stop the
others' calls too. Each registry below stands for one process: they share
nothing but the Temporal server (the two-process test with real ``aiworker
worker`` processes is tests/reliability/test_shared_breaker_processes.py).

The tests with a stand-in client cover what a real server cannot be made to
do on demand: a read that hangs, a server that errors, and many callers at
the same instant."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import pytest
from conftest import running_stack
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.breakers import BreakerRegistry, SharedBreakers
from aiworker.activities.errors import CircuitOpenError
from aiworker.config.settings import Settings
from aiworker.schemas import names

KEY = "host:shop.example"


def process_view(
    client: Client, settings: Settings, refresh_seconds: float = 0.2, wait_seconds: float = 10.0
) -> BreakerRegistry:
    shared = SharedBreakers(
        settings.queue(names.PIPELINES_QUEUE),
        client=client,
        refresh_seconds=refresh_seconds,
        wait_seconds=wait_seconds,
    )
    return BreakerRegistry("host", failure_threshold=5, open_seconds=30, shared=shared)


async def open_until_in_temporal(client: Client, settings: Settings, key: str) -> float:
    handle = client.get_workflow_handle(
        names.shared_breaker_workflow_id(key, settings.task_queue_suffix)
    )
    return await handle.query(names.BREAKER_STATE_QUERY, result_type=float)


async def eventually_open(
    registry: BreakerRegistry, target: str, timeout: float
) -> CircuitOpenError:
    async def fails_fast() -> CircuitOpenError | None:
        try:
            await registry.acheck(target)
        except CircuitOpenError as e:
            return e
        return None

    return await wait_until(
        fails_fast, f"{target} to fail fast in the other process view", timeout=timeout
    )


async def test_breaker_opened_by_one_process_makes_the_other_fail_fast(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings):
        a, b = process_view(client, settings), process_view(client, settings)
        await b.acheck("shop.example")  # closed everywhere at first
        for _ in range(5):
            await a.acheck("shop.example")
            a.record_failure("shop.example")
        assert a.state("shop.example") == "open"
        # the opening reaches Temporal in the background
        seen: list[float] = []

        async def published() -> bool:
            try:
                seen.append(await open_until_in_temporal(client, settings, KEY))
            except Exception:
                return False
            return seen[-1] > time.time()

        await wait_until(published, "the opening to reach Temporal", timeout=15)

        # A process that never asked about the target fails fast on its very first call.
        fresh = process_view(client, settings)
        with pytest.raises(CircuitOpenError) as first:
            await fresh.acheck("shop.example")
        assert first.value.code.value == "circuit_open"
        assert 0 < (first.value.retry_after or 0) <= 30
        assert "another worker process" in first.value.message
        # b asked before the opening: its view is at most refresh_seconds old.
        err = await eventually_open(b, "shop.example", timeout=15)
        assert "another worker process" in err.message
        # b and fresh saw no failure themselves: the state came through Temporal
        assert b.state("shop.example") == fresh.state("shop.example") == "closed"
        # other targets are not affected
        await b.acheck("other.example")
        await fresh.acheck("other.example")


async def test_a_target_never_opened_anywhere_passes_after_one_read(
    client: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # No worker polls the pipelines queue here: the answer comes from the server alone.
    view = process_view(client, settings)
    assert view.shared is not None
    with caplog.at_level(logging.WARNING, logger="aiworker.breaker"):
        await view.acheck("never.example")
        assert await view.shared.refresh("host:never.example") == 0.0
    assert not [r for r in caplog.records if r.getMessage().startswith("breaker.refresh")]


async def test_the_state_is_read_without_a_worker_from_the_memo(
    client: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker that ran the breaker workflow is gone (killed, scaled down):
    other processes still read the opening, from the memo the server keeps."""
    wid = names.shared_breaker_workflow_id(KEY, settings.task_queue_suffix)
    handle = client.get_workflow_handle(wid)
    until = time.time() + 30
    async with running_stack(client, settings):
        publisher = SharedBreakers(settings.queue(names.PIPELINES_QUEUE), client=client)
        publisher.publish(KEY, until)

        async def in_memo() -> bool:
            try:
                desc = await handle.describe()
            except RPCError:
                return False
            return bool(await desc.memo_value(names.BREAKER_MEMO_KEY, 0.0) == until)

        await wait_until(in_memo, "the opening to reach the memo", timeout=15)
    # no worker polls any more; a query would wait for one until its RPC deadline
    view = process_view(client, settings, wait_seconds=15)
    with caplog.at_level(logging.WARNING, logger="aiworker.breaker"):
        with pytest.raises(CircuitOpenError) as e:
            await view.acheck("shop.example")
    assert "another worker process" in e.value.message
    assert not [r for r in caplog.records if r.getMessage().startswith("breaker.refresh")]
    await handle.terminate("test over")


def test_without_sharing_a_registry_is_process_local() -> None:
    a = BreakerRegistry("host", failure_threshold=1)
    b = BreakerRegistry("host", failure_threshold=1)
    a.record_failure("x")
    with pytest.raises(CircuitOpenError):
        a.check("x")
    b.check("x")


class StandInTemporal:
    """A client whose breaker read (describe) waits for the test, answers, or fails."""

    def __init__(self, until: float = 0.0) -> None:
        self.until = until
        self.error: Exception | None = None
        self.gate = asyncio.Event()
        self.gate.set()
        self.queries = 0
        self.status = WorkflowExecutionStatus.RUNNING

    def get_workflow_handle(self, workflow_id: str) -> StandInTemporal:
        return self

    async def describe(self, **kw: Any) -> StandInTemporal:
        self.queries += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self

    async def memo_value(self, key: str, default: Any = None, **kw: Any) -> Any:
        if key == names.BREAKER_PROBE_MEMO_KEY:
            return default
        assert key == names.BREAKER_MEMO_KEY
        return self.until


def stand_in_view(
    temporal: StandInTemporal, refresh_seconds: float = 60, wait_seconds: float = 5
) -> BreakerRegistry:
    shared = SharedBreakers(
        "aiworker-pipelines",
        client=cast(Client, temporal),
        refresh_seconds=refresh_seconds,
        wait_seconds=wait_seconds,
    )
    return BreakerRegistry("host", failure_threshold=1, open_seconds=30, shared=shared)


async def test_concurrent_first_callers_share_one_refresh_and_all_fail_fast() -> None:
    temporal = StandInTemporal(until=time.time() + 20)
    temporal.gate.clear()
    view = stand_in_view(temporal)
    calls = [asyncio.ensure_future(view.acheck("t.example")) for _ in range(10)]
    await wait_until(lambda: temporal.queries == 1, "the refresh query", timeout=5)
    assert not any(c.done() for c in calls)  # every caller waits for the answer
    temporal.gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, CircuitOpenError) for r in results), results
    # the view is fresh now: later calls use it without asking again
    with pytest.raises(CircuitOpenError):
        await view.acheck("t.example")
    assert temporal.queries == 1


async def test_a_hung_temporal_never_fails_a_call_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    temporal = StandInTemporal(until=time.time() + 20)
    temporal.gate.clear()
    view = stand_in_view(temporal, refresh_seconds=0, wait_seconds=0.05)
    with caplog.at_level(logging.WARNING, logger="aiworker.breaker"):
        for _ in range(3):
            await view.acheck("t.example")  # the last known state: never opened
    slow = [r for r in caplog.records if r.getMessage() == "breaker.refresh_slow"]
    assert len(slow) == 1
    assert temporal.queries == 1  # one refresh in flight, however many calls
    # when the answer arrives, the next call honours it
    temporal.gate.set()
    assert view.shared is not None
    await wait_until(
        lambda: view.shared is not None and not view.shared._in_flight, "answer", timeout=5
    )
    with pytest.raises(CircuitOpenError):
        await view.acheck("t.example")


async def test_a_failing_temporal_lets_calls_through_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    temporal = StandInTemporal()
    temporal.error = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    view = stand_in_view(temporal, refresh_seconds=0)
    with caplog.at_level(logging.WARNING, logger="aiworker.breaker"):
        for _ in range(3):
            await view.acheck("t.example")
    assert temporal.queries == 3
    failed = [r for r in caplog.records if r.getMessage() == "breaker.refresh_failed"]
    assert len(failed) == 1


async def test_not_found_means_never_opened() -> None:
    temporal = StandInTemporal()
    temporal.error = RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
    view = stand_in_view(temporal)
    await view.acheck("t.example")
    assert view.shared is not None
    assert view.shared.open_until("host:t.example") == 0.0
    assert "host:t.example" not in view.shared._failing


async def test_a_locally_open_breaker_fails_fast_without_asking_temporal() -> None:
    temporal = StandInTemporal()
    view = stand_in_view(temporal)
    view.record_failure("t.example")
    with pytest.raises(CircuitOpenError) as e:
        await view.acheck("t.example")
    assert "another worker process" not in e.value.message
    assert temporal.queries == 0


async def passes(registry: BreakerRegistry, target: str) -> bool:
    try:
        await registry.acheck(target)
    except CircuitOpenError:
        return False
    return True


async def test_one_probe_across_views_and_a_silent_prober_frees_it_after_the_lease(
    client: Client, settings: Settings
) -> None:
    """Half-open across processes: one view's call is the probe, the other's is
    refused; a prober that never reports (killed mid-call) frees the probe when its
    lease (one open period) ends; a probe's success closes the breaker everywhere."""

    def view() -> BreakerRegistry:
        shared = SharedBreakers(
            settings.queue(names.PIPELINES_QUEUE),
            client=client,
            refresh_seconds=0.1,
            wait_seconds=10,
        )
        return BreakerRegistry("host", failure_threshold=1, open_seconds=1.0, shared=shared)

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        a, b, c = view(), view(), view()
        a.record_failure("probe.example")  # opens, and tells the breaker workflow
        await eventually_open(b, "probe.example", timeout=15)
        # the open period ends: the first to ask probes, the others are refused
        await wait_until(lambda: passes(b, "probe.example"), "b's probe", timeout=15)
        assert b.state("probe.example") == "half_open"
        with pytest.raises(CircuitOpenError) as refused:
            await c.acheck("probe.example")
        assert "a probe is in flight from another worker process" in refused.value.message
        with pytest.raises(CircuitOpenError) as local:
            await b.acheck("probe.example")  # b's own probe is in flight
        assert "its probe is in flight" in local.value.message
        # b never reports (its process died): c gets the probe once the lease ends
        await wait_until(lambda: passes(c, "probe.example"), "c's probe after the lease")
        with pytest.raises(CircuitOpenError):
            await a.acheck("probe.example")
        c.record_success("probe.example")  # closes it everywhere
        assert c.state("probe.example") == "closed"
        await wait_until(lambda: passes(a, "probe.example"), "a's call after the close")
        assert a.state("probe.example") == "closed"
        for _ in range(3):  # closed: no more probes, every call passes
            await a.acheck("probe.example")
            await c.acheck("probe.example")


async def test_a_half_open_view_fails_fast_when_another_process_reopened(
    client: Client, settings: Settings
) -> None:
    """A process whose own breaker is half-open does not probe a target another
    process has just opened again: it fails fast as open elsewhere."""
    shared = [
        SharedBreakers(settings.queue(names.PIPELINES_QUEUE), client=client, refresh_seconds=0.1)
        for _ in range(2)
    ]
    a = BreakerRegistry("host", failure_threshold=1, open_seconds=1.0, shared=shared[0])
    b = BreakerRegistry("host", failure_threshold=1, open_seconds=30.0, shared=shared[1])
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        a.record_failure("again.example")
        await wait_until(lambda: a.state("again.example") == "half_open", "a half-open")
        b.record_failure("again.example")  # b opens it for 30 s, for everyone

        async def reopened() -> bool:
            until = await open_until_in_temporal(client, settings, "host:again.example")
            return until > time.time() + 10

        await wait_until(reopened, "b's opening in the breaker workflow", timeout=15)

        async def open_elsewhere() -> CircuitOpenError | None:
            try:
                await a.acheck("again.example")
            except CircuitOpenError as e:
                return e if "opened by another worker process" in e.message else None
            raise AssertionError("a probed a target another process had opened again")

        await wait_until(open_elsewhere, "a to see b's opening", timeout=15)
        assert a.state("again.example") == "half_open"  # no probe of its own went out
