"""Unit tests of the robots.txt cache and per-host politeness."""

from __future__ import annotations

import asyncio

from aiworker.activities.errors import FetchFailedError
from aiworker.activities.tools.robots import Politeness, RobotsCache


async def test_robots_cache_fetches_once_per_origin_within_ttl() -> None:
    loads: list[str] = []

    async def load(url: str) -> tuple[int, str]:
        loads.append(url)
        await asyncio.sleep(0)
        return 200, "User-agent: *\nDisallow: /private/\nCrawl-delay: 2\n"

    cache = RobotsCache(ttl_seconds=3600)
    results = await asyncio.gather(
        *(cache.allowed("http://a:80", f"http://a:80/p/{i}", "bot/1", load) for i in range(5))
    )
    assert results == [(True, 2.0)] * 5
    assert await cache.allowed("http://a:80", "http://a:80/private/x", "bot/1", load) == (
        False,
        2.0,
    )
    assert loads == ["http://a:80/robots.txt"]
    expired = RobotsCache(ttl_seconds=0)
    await expired.allowed("http://a:80", "http://a:80/", "bot/1", load)
    await expired.allowed("http://a:80", "http://a:80/", "bot/1", load)
    assert len(loads) == 3


async def test_robots_4xx_allows_all_and_failures_are_not_cached() -> None:
    calls = 0

    async def flaky(url: str) -> tuple[int, str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise FetchFailedError("robots.txt unavailable", url=url, status_code=503)
        return 404, ""

    cache = RobotsCache()
    try:
        await cache.allowed("http://b:80", "http://b:80/x", "bot", flaky)
        raise AssertionError("a 5xx robots.txt must fail the fetch")
    except FetchFailedError:
        pass
    assert await cache.allowed("http://b:80", "http://b:80/x", "bot", flaky) == (True, None)
    assert calls == 2


async def test_politeness_bounds_concurrency_per_host_across_callers() -> None:
    polite = Politeness(max_concurrent=2)
    active: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}

    async def request(host: str) -> None:
        async with polite.slot(host):
            active[host] += 1
            peak[host] = max(peak[host], active[host])
            for _ in range(3):
                await asyncio.sleep(0)
            active[host] -= 1

    await asyncio.gather(*(request(h) for h in "ab" * 6))
    assert peak == {"a": 2, "b": 2}
    assert polite._slots == {}  # idle hosts are forgotten
