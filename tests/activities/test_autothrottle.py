"""The autothrottle: a per-host delay that follows a loopback server's latency and errors.

The server's latency and status are set by the test; the server records when
each request arrived, so the spacing the fetch tool kept is measured where a
site would see it. Only lower bounds are asserted (a slow machine spaces
requests more, never less).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support.loopback import Exchange, Loopback, serve
from support.payloads import stack_settings
from temporalio.client import Client

from aiworker.activities.errors import FetchFailedError, RateLimitedError
from aiworker.activities.tools import AutoThrottle, scrape_tools
from aiworker.activities.tools.autothrottle import ERROR_STEP_SECONDS
from aiworker.activities.tools.fetch import FetchTool
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.pipeline import PipelineResult

# Spacing measured at the server may fall short of the delay by clock granularity.
SLACK = 0.02


@dataclass
class Site:
    """A site whose latency, status and robots.txt the test sets; it logs arrivals."""

    latency: float = 0.0
    status: int = 200
    retry_after: str | None = None
    robots: str = ""
    arrivals: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: Loopback | None = None

    def handle(self, ex: Exchange) -> None:
        if ex.path == "/robots.txt":
            return ex.send(200, self.robots.encode(), "text/plain")
        with self.lock:
            self.arrivals.append((time.monotonic(), ex.path))
            latency, status, retry = self.latency, self.status, self.retry_after
        if latency:
            ex.stopping.wait(latency)
        headers = {"Retry-After": retry} if retry and status in (429, 503) else None
        ex.send(status, b"<html><body><h1>page</h1></body></html>", headers=headers)

    def url(self, path: str) -> str:
        assert self.server is not None
        return self.server.url(path)

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def gaps(self, paths: set[str] | None = None) -> list[float]:
        with self.lock:
            times = [t for t, p in self.arrivals if paths is None or p in paths]
        return [b - a for a, b in itertools.pairwise(times)]


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site()
    with serve(s.handle) as server:
        s.server = server
        yield s


def tools_for(tmp: Path, **kw: Any) -> tuple[FetchTool, AutoThrottle]:
    tools = scrape_tools(stack_settings(tmp, **kw))
    fetcher: FetchTool = tools["fetch_url"]
    assert fetcher.politeness.throttle is not None
    return fetcher, fetcher.politeness.throttle


async def fetch(fetcher: FetchTool, url: str) -> None:
    await fetcher.fetch(url, timeout=10)


async def test_the_delay_rises_toward_latency_over_target_when_the_site_is_slow(
    site: Site, tmp_path: Path
) -> None:
    fetcher, throttle = tools_for(tmp_path, autothrottle_target_concurrency=1.0)
    try:
        site.latency = 0.2
        await fetch(fetcher, site.url("/a"))
        first = throttle.delay(site.host)
        # Scrapy's rule: the target (0.2 / 1) is above the old delay (0), so it is taken.
        assert first >= 0.2 - SLACK
        for i in range(3):
            await fetch(fetcher, site.url(f"/b{i}"))
        assert 0.2 - SLACK <= throttle.delay(site.host) < 0.5
        # Sequential fetches of one task are spaced by the delay too: the site saw
        # each request start at least one delay after the one before.
        assert all(g >= 0.2 - SLACK for g in site.gaps())
    finally:
        await fetcher.aclose()


async def test_429_and_503_raise_the_delay_and_retry_after_holds_the_host(
    site: Site, tmp_path: Path
) -> None:
    fetcher, throttle = tools_for(tmp_path)
    try:
        site.status = 503
        with pytest.raises(FetchFailedError):
            await fetch(fetcher, site.url("/down"))
        assert throttle.delay(site.host) >= ERROR_STEP_SECONDS
        with pytest.raises(FetchFailedError):
            await fetch(fetcher, site.url("/down"))
        assert throttle.delay(site.host) >= 2 * ERROR_STEP_SECONDS  # doubled
        site.status, site.retry_after = 429, "1"
        with pytest.raises(RateLimitedError):
            await fetch(fetcher, site.url("/limited"))
        raised = throttle.delay(site.host)
        assert raised >= 4 * ERROR_STEP_SECONDS
        site.status, site.retry_after = 200, None
        await fetch(fetcher, site.url("/ok"))
        # Retry-After: 1 held the host: the next request came a second later at the earliest.
        assert site.gaps({"/limited", "/ok"})[-1] >= 1.0 - SLACK
    finally:
        await fetcher.aclose()


async def test_healthy_replies_bring_the_delay_back_down_to_the_floor(
    site: Site, tmp_path: Path
) -> None:
    fetcher, throttle = tools_for(tmp_path, scrape_min_delay_seconds=0.05)
    try:
        site.status = 503
        for _ in range(3):
            with pytest.raises(FetchFailedError):
                await fetch(fetcher, site.url("/down"))
        high = throttle.delay(site.host)
        assert high >= 0.4
        site.status = 200
        seen = [high]
        for i in range(8):
            await fetch(fetcher, site.url(f"/ok{i}"))
            seen.append(throttle.delay(site.host))
        assert all(b <= a for a, b in itertools.pairwise(seen)), seen
        assert seen[-1] < 0.06  # halved each time, down to the floor
        assert min(seen) >= 0.05  # and never under it
        assert all(g >= 0.05 - SLACK for g in site.gaps())
    finally:
        await fetcher.aclose()


async def test_crawl_delay_is_a_floor_the_throttle_never_goes_under(
    site: Site, tmp_path: Path
) -> None:
    site.robots = "User-agent: *\nCrawl-delay: 0.3\n"
    fetcher, throttle = tools_for(tmp_path)
    try:
        for i in range(3):
            await fetch(fetcher, site.url(f"/p{i}"))
        assert throttle.delay(site.host) < 0.3  # a fast site: the throttle's own delay is low
        assert throttle.delay(site.host, 0.3) == 0.3
        assert len(site.gaps()) == 2 and all(g >= 0.3 - SLACK for g in site.gaps())
    finally:
        await fetcher.aclose()


def test_the_ceiling_bounds_the_delay_and_a_retry_after_hold() -> None:
    t = AutoThrottle(target_concurrency=1, floor_seconds=0.1, ceiling_seconds=2.0)
    for _ in range(10):
        t.observe("h:80", 0.01, 503, retry_after=600)
    assert t.delay("h:80") == 2.0
    assert 1.5 < t.hold("h:80") <= 2.0
    t.observe("h:80", 50.0, 200)  # a very slow page: capped too
    assert t.delay("h:80") == 2.0
    off = AutoThrottle(enabled=False, floor_seconds=0.1)
    off.observe("h:80", 5.0, 503, retry_after=5)
    assert (off.delay("h:80"), off.hold("h:80"), off.delay("h:80", 0.4)) == (0.1, 0.0, 0.4)
    with pytest.raises(ValueError):
        AutoThrottle(target_concurrency=0)


def test_settings_configure_the_throttle_and_refuse_nonsense() -> None:
    s = Settings.from_env(
        {
            "AIWORKER_SCRAPE_MIN_DELAY_SECONDS": "0.5",
            "AIWORKER_SCRAPE_MAX_DELAY_SECONDS": "10",
            "AIWORKER_AUTOTHROTTLE": "false",
            "AIWORKER_AUTOTHROTTLE_TARGET_CONCURRENCY": "2",
        }
    )
    assert (s.scrape_min_delay_seconds, s.scrape_max_delay_seconds) == (0.5, 10.0)
    assert (s.autothrottle, s.autothrottle_target_concurrency) == (False, 2.0)
    with pytest.raises(SettingsError, match="AIWORKER_AUTOTHROTTLE_TARGET_CONCURRENCY"):
        Settings.from_env({"AIWORKER_AUTOTHROTTLE_TARGET_CONCURRENCY": "0"})
    with pytest.raises(SettingsError, match="AIWORKER_SCRAPE_MIN_DELAY_SECONDS"):
        Settings.from_env({"AIWORKER_SCRAPE_MIN_DELAY_SECONDS": "-1"})


@pytest.fixture
def client(env: Any) -> Client:
    c: Client = env.client
    return c


async def test_two_concurrent_activities_of_one_process_share_the_hosts_delay(
    client: Client, site: Site, tmp_path: Path
) -> None:
    """A pipeline on a real Temporal server: a slow page raises the host's delay, then
    two scrape steps run at once in the same worker process and the site sees their
    requests spaced by that one shared delay."""
    settings = stack_settings(tmp_path, autothrottle_target_concurrency=1.0)
    tools = scrape_tools(settings)
    fetcher: FetchTool = tools["fetch_url"]
    h1 = {"fields": {"h1": {"selector": "h1", "required": True}}}
    site.latency = 0.4

    def step(sid: str, path: str, **kw: Any) -> dict[str, Any]:
        inp = {"url": site.url(path), "extraction_spec": h1}
        return {"id": sid, "worker": "web-scrape", "input": inp, **kw}

    pipeline = {
        "name": "throttle-shared",
        "tenant": "acme",
        "steps": [
            step("slow", "/slow"),
            step("left", "/left", depends_on=["slow"]),
            step("right", "/right", depends_on=["slow"]),
        ],
    }
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            handle = await stack.start(pipeline)
            result: PipelineResult = await handle.result()
    finally:
        await fetcher.aclose()
    assert result.status == "succeeded", result
    throttle = fetcher.politeness.throttle
    assert throttle is not None and throttle.delay(site.host) >= 0.4 - SLACK
    # left and right ran concurrently, yet the site saw them a delay apart: the
    # second waited on the delay the first activity's slow page had set.
    [gap] = site.gaps({"/left", "/right"})
    assert gap >= 0.4 - SLACK
