"""Tests of the fetch_url tool's pure parts and of its requests against loopback servers."""

from __future__ import annotations

import pytest
from fixtures.scrape_site import CP1252_HTML, SJIS_HTML
from support.loopback import Exchange, serve

from aiworker.activities.errors import AccessDeniedError, InvalidInputError, PayloadTooLargeError
from aiworker.activities.publish import WebhookPoster
from aiworker.activities.retry_after import parse_retry_after
from aiworker.activities.tools.charset import decode_body
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.fetch import FetchLimits, FetchTool
from aiworker.config.settings import Settings


def test_charsets_header_meta_detection() -> None:
    assert decode_body(CP1252_HTML, None) == (CP1252_HTML.decode("cp1252"), "windows-1252")
    text, enc = decode_body(SJIS_HTML, "Shift_JIS")
    assert "日本語のページです" in text and enc == "shift_jis"
    text, enc = decode_body(SJIS_HTML * 20, None)
    assert "東京都港区" in text
    assert decode_body("é".encode("latin-1"), "iso-8859-1") == ("é", "windows-1252")
    assert decode_body("ü".encode(), None) == ("ü", "utf-8")


def test_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert parse_retry_after("soon") is None


async def test_body_cap() -> None:
    def handle(exchange: Exchange) -> None:
        exchange.send(200, b"x" * 2048, "text/html")

    with serve(handle) as site:
        fetcher = FetchTool(
            EgressPolicy(allow_private_networks=True), limits=FetchLimits(max_bytes=1024)
        )
        try:
            with pytest.raises(PayloadTooLargeError):
                await fetcher.fetch(site.url("/"), timeout=5, respect_robots=False)
        finally:
            await fetcher.aclose()


async def test_content_type_check_and_robots_use_the_sent_user_agent() -> None:
    seen: list[tuple[str, str]] = []

    def handle(exchange: Exchange) -> None:
        seen.append((exchange.path, exchange.headers["User-Agent"]))
        if exchange.path == "/robots.txt":
            exchange.send(200, b"User-agent: pickybot\nDisallow: /\n", "text/plain")
        elif exchange.path == "/data.json":
            exchange.send_json(200, {"a": 1})
        else:
            exchange.send(200, b"<h1>hi</h1>", "text/html")

    with serve(handle) as site:
        fetcher = FetchTool(EgressPolicy(allow_private_networks=True))
        try:
            page = await fetcher.fetch(site.url("/a"), timeout=5, user_agent="okbot/1")
            assert page.text == "<h1>hi</h1>" and page.status_code == 200
            with pytest.raises(InvalidInputError):
                await fetcher.fetch(site.url("/data.json"), timeout=5)
            with pytest.raises(AccessDeniedError) as e:
                await fetcher.fetch(site.url("/b"), timeout=5, user_agent="PickyBot/2.0")
            assert e.value.context["reason"] == "robots"
        finally:
            await fetcher.aclose()
    assert seen[0] == ("/robots.txt", "okbot/1")
    assert [p for p, _ in seen].count("/robots.txt") == 1  # cached per origin
    assert ("/b", "PickyBot/2.0") not in seen


async def test_no_cookie_outlives_the_request_that_received_it() -> None:
    # The tools serve every call and tenant of a process: a session cookie one
    # call received must not go out with the next call to that site.
    seen: list[tuple[str, str | None]] = []

    def handle(exchange: Exchange) -> None:
        exchange.body()  # a POST's body read, so the connection serves the next request
        seen.append((exchange.path, exchange.headers.get("Cookie")))
        exchange.send(200, b"<p>hi</p>", headers={"Set-Cookie": "sid=tenant-a; Path=/"})

    with serve(handle) as site:
        fetcher = FetchTool(EgressPolicy(allow_private_networks=True))
        poster = WebhookPoster(Settings(allow_private_networks=True))
        try:
            for path in ("/a", "/b"):
                await fetcher.fetch(site.url(path), timeout=5, respect_robots=False)
            for path in ("/hook-a", "/hook-b"):
                await poster.post(site.url(path), {"n": 1}, {}, timeout_s=5)
        finally:
            await fetcher.aclose()
            await poster.aclose()
    assert seen == [("/a", None), ("/b", None), ("/hook-a", None), ("/hook-b", None)]
