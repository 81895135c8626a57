"""Unit tests of the robots.txt cache and per-host politeness."""

from __future__ import annotations

import asyncio

from support.loopback import Exchange, serve

from aiworker.activities.errors import AccessDeniedError, FetchFailedError
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.fetch import FetchTool
from aiworker.activities.tools.robots import MAX_CRAWL_DELAY_SECONDS, Politeness, RobotsCache


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


async def test_an_endless_crawl_delay_is_held_to_the_ceiling() -> None:
    rules = {
        "huge": "User-agent: *\nCrawl-delay: 1000000000\n",
        "nan": "User-agent: *\nCrawl-delay: nan\n",
        "negative": "User-agent: *\nCrawl-delay: -5\n",
        "small": "User-agent: *\nCrawl-delay: 0.5\n",
    }

    async def load(url: str) -> tuple[int, str]:
        return 200, rules[url.split("//")[1].split(":")[0]]

    cache = RobotsCache()
    delays = {
        host: (await cache.allowed(f"http://{host}:80", f"http://{host}:80/", "bot", load))[1]
        for host in rules
    }
    assert delays == {
        "huge": MAX_CRAWL_DELAY_SECONDS,
        "nan": None,
        "negative": None,
        "small": 0.5,
    }


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


# --- RFC 9309 through the real fetch path ---------------------------------------------------

# Section 5.1 ("Simple Example") and 5.2 ("Longest Match") verbatim, in the "*" group the
# cases of sections 2.2.2 (longest match; Allow wins a tie; percent-encoding) and 2.2.3
# (special characters "*" and "$", and "%2A"/"%24" for a literal "*" and "$").
RFC9309_ROBOTS = """\
User-Agent: *
Disallow: *.gif$
Disallow: /example/
Allow: /publications/
Disallow: /*.pdf$
Disallow: /private
Allow: /private/public
Disallow: /tie
Allow: /tie
Disallow: /foo/bar/%E3%83%84
Disallow: /path/file-with-a-%2A.html
Disallow: /path/foo-%24
Disallow: /this/*/exactly$

User-Agent: foobot
Disallow:/
Allow:/example/page.html
Allow:/example/allowed.gif

User-Agent: barbot
User-Agent: bazbot
Disallow: /example/page.html

User-Agent: quxbot

User-Agent: longbot
Allow: /example/page/
Disallow: /example/page/disallowed.gif
"""

# (user agent, path, allowed); every False was True under urllib.robotparser or vice versa
# where marked "was".
RFC9309_CASES = [
    ("otherbot/1.0", "/a.gif", False),  # was allowed: "$" and a leading "*"
    ("otherbot/1.0", "/a.gifx", True),
    ("otherbot/1.0", "/example/x", False),
    ("otherbot/1.0", "/publications/x", True),
    ("otherbot/1.0", "/a.pdf", False),  # was allowed
    ("otherbot/1.0", "/a.pdfx", True),
    ("otherbot/1.0", "/private/public/x", True),  # was denied: the first rule won
    ("otherbot/1.0", "/private/x", False),
    ("otherbot/1.0", "/tie", True),  # was denied: Allow wins a tie
    ("otherbot/1.0", "/foo/bar/\u30c4", False),
    ("otherbot/1.0", "/foo/bar/%E3%83%84", False),
    ("otherbot/1.0", "/path/file-with-a-*.html", False),
    ("otherbot/1.0", "/path/foo-$", False),
    ("otherbot/1.0", "/this/a/b/exactly", False),  # was allowed
    ("otherbot/1.0", "/this/a/exactly/not", True),
    ("FooBot/2.1", "/example/page.html", True),  # was denied
    ("FooBot/2.1", "/example/allowed.gif", True),  # was denied
    ("FooBot/2.1", "/x", False),
    ("barbot", "/example/page.html", False),
    ("bazbot/3", "/example/page.html", False),
    ("barbot", "/x", True),
    ("quxbot", "/example/x", True),  # was denied: an empty group allows everything
    ("longbot", "/example/page/", True),
    ("longbot", "/example/page/disallowed.gif", False),  # was allowed
]


async def test_rfc9309_examples_through_the_fetch_tool() -> None:
    seen: list[str] = []

    def site(ex: Exchange) -> None:
        seen.append(ex.target)
        if ex.path == "/robots.txt":
            ex.send(200, RFC9309_ROBOTS.encode(), "text/plain")
        else:
            ex.send(200, b"<html><h1>page</h1></html>")

    fetcher = FetchTool(EgressPolicy(allow_private_networks=True))
    outcomes = []
    try:
        with serve(site) as server:
            for ua, path, _ in RFC9309_CASES:
                try:
                    await fetcher.fetch(server.url(path), timeout=10, user_agent=ua)
                    outcomes.append((ua, path, True))
                except AccessDeniedError as e:
                    assert e.context["reason"] == "robots"
                    outcomes.append((ua, path, False))
    finally:
        await fetcher.aclose()
    assert outcomes == RFC9309_CASES
    assert seen.count("/robots.txt") == 1
    # A denied page was never requested.
    requested = {t for t in seen if t != "/robots.txt"}
    assert len(requested) == sum(allowed for _, _, allowed in RFC9309_CASES)
