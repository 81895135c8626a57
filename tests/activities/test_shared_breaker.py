"""Breakers shared by worker processes: one process's failures stop the
others' calls too. Each registry below stands for one process: they share
nothing but the Temporal server."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import running_stack
from temporalio.client import Client

from activities.breaker import BreakerRegistry
from activities.errors import CircuitOpenError
from activities.shared_breaker import SharedBreakers
from schemas import names
from schemas.settings import Settings


def process_view(client: Client, settings: Settings) -> BreakerRegistry:
    shared = SharedBreakers(
        settings.queue(names.PIPELINES_QUEUE), client=client, refresh_seconds=0.2
    )
    return BreakerRegistry("host", failure_threshold=5, open_seconds=30, shared=shared)


async def eventually_open(
    registry: BreakerRegistry, target: str, timeout: float
) -> CircuitOpenError:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            registry.check(target)
        except CircuitOpenError as e:
            return e
        await asyncio.sleep(0.1)
    raise AssertionError(f"{target} never failed fast in the other process view")


async def test_breaker_opened_by_one_process_makes_the_other_fail_fast(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings):
        a, b = process_view(client, settings), process_view(client, settings)
        b.check("shop.example")  # closed everywhere at first
        for _ in range(5):
            a.check("shop.example")
            a.record_failure("shop.example")
        assert a.state("shop.example") == "open"
        err = await eventually_open(b, "shop.example", timeout=15)
        assert err.code.value == "circuit_open"
        assert 0 < (err.retry_after or 0) <= 30
        assert "another worker process" in err.message
        # b saw no failure itself: its own circuit is closed, the state came through Temporal
        assert b.state("shop.example") == "closed"
        # other targets are not affected
        b.check("other.example")
        handle = client.get_workflow_handle(
            names.shared_breaker_workflow_id("host:shop.example", settings.task_queue_suffix)
        )
        until = await handle.query(names.BREAKER_STATE_QUERY, result_type=float)
        assert until > time.time()


def test_without_sharing_a_registry_is_process_local() -> None:
    a = BreakerRegistry("host", failure_threshold=1)
    b = BreakerRegistry("host", failure_threshold=1)
    a.record_failure("x")
    with pytest.raises(CircuitOpenError):
        a.check("x")
    b.check("x")
