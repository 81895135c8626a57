"""The web-scrape worker end to end: real Temporal server, real loopback site.

Each behaviour runs as a step of a ``PipelineWorkflow`` (many steps per
pipeline, in parallel, to keep the suite fast); attempt counts and error
codes come from the pipeline result and the workflow history.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.scrape_site import FixtureSite, site  # noqa: F401  (module fixture)
from support.history import workflow_task_failures
from support.loopback import serve
from support.payloads import stack_settings
from temporalio.client import Client

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.tools import EgressPolicy, scrape_tools
from aiworker.config.catalog import get_spec
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult

LISTING_SPEC = {
    "fields": {
        "title": {"selector": "h1", "required": True},
        "items": {
            "selector": ".product",
            "many": True,
            "required": True,
            "fields": {
                "name": {"selector": ".name"},
                "price": {"selector": ".price", "type": "number"},
                "link": {"selector": "a", "attr": "href", "type": "url"},
            },
        },
    }
}
H1 = {"fields": {"h1": {"selector": "h1", "required": True}}}


def make_settings(tmp: Path, *, private: bool) -> Settings:
    return stack_settings(
        tmp,
        allow_private_networks=private,
        # these tests fan out many steps of one tenant; the spec's 10/min per
        # tenant is exercised by tests/workflows/test_limits.py
        rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")),
    )


@pytest_asyncio.fixture(scope="module")
async def scrape(client: Client, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """One stack for the module; a breaker that never opens, so tests stay independent."""
    settings = make_settings(tmp_path_factory.mktemp("scrape"), private=True)
    tools = scrape_tools(settings, breakers=BreakerRegistry("host", failure_threshold=10_000))
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            yield stack
    finally:
        await tools["fetch_url"].aclose()


@pytest.fixture(scope="module")
def client(env: Any) -> Client:
    c: Client = env.client
    return c


def step(sid: str, url: str, spec: dict[str, Any] | str = H1, **extra: Any) -> dict[str, Any]:
    inp = {"url": url, "extraction_spec": spec, **extra.pop("input", {})}
    return {"id": sid, "worker": "web-scrape", "input": inp, "on_failure": "continue", **extra}


async def run(
    stack: Stack, steps: list[dict[str, Any]], inputs: dict[str, Any] | None = None
) -> tuple[PipelineResult, Any]:
    pipeline = {"name": "scrape-test", "tenant": "acme", "inputs": inputs or {}, "steps": steps}
    handle = await stack.start(pipeline)
    result: PipelineResult = await handle.result()
    return result, handle


async def test_pages_extract_end_to_end(scrape: Stack, site: FixtureSite) -> None:
    u = site.url
    result, _ = await run(
        scrape,
        [
            step("listing", u("/list"), LISTING_SPEC),
            step(
                "article",
                u("/article"),
                {
                    "fields": {
                        "price": {"selector": ".price", "type": "number", "locale": "de-DE"},
                        "day": {"selector": ".date", "type": "date", "locale": "de"},
                    },
                    "metadata": True,
                },
            ),
            step("cp1252", u("/cp1252")),
            step("sjis", u("/sjis")),
            step("sjis_detect", u("/sjis-detect")),
            step("gzip", u("/gzip")),
            step("deflate", u("/deflate")),
            step("brotli", u("/brotli")),
            step("chain", u("/redirect/3")),
            step("ua", u("/ua"), input={"user_agent": "mybot/2.0"}),
            step("changed", u("/changed"), LISTING_SPEC),
        ],
    )
    s = result.steps
    assert {k: (v.status, v.attempts) for k, v in s.items()} == {
        **{k: ("succeeded", 1) for k in s if k != "changed"},
        "changed": ("partial", 1),
    }
    assert result.status == "partial"

    listing = s["listing"].outputs
    assert listing["data"]["title"] == "Products"
    assert listing["data"]["items"][0] == {
        "name": "Item 1",
        "price": 1199.0,
        "link": u("/item/1"),
    }
    src = listing["source"]
    assert src["url"] == src["final_url"] == u("/list")
    assert src["status_code"] == 200 and src["encoding"] == "utf-8"
    assert src["content_type"].startswith("text/html") and src["elapsed_ms"] >= 0
    # The raw page is an artifact (content-addressed, tenant-scoped), never inline.
    [art] = s["listing"].artifacts
    assert art["sha256"] == src["sha256"] and art["size_bytes"] == src["bytes"]
    raw = await asyncio.to_thread(Path(art["uri"][len("file://") :]).read_bytes)
    assert hashlib.sha256(raw).hexdigest() == src["sha256"]
    assert "/artifacts/acme/" in art["uri"]
    assert "<li" not in str(listing)

    article = s["article"].outputs["data"]
    assert article["price"] == 1299.0 and article["day"] == "2024-03-05"
    assert article["metadata"]["canonical_url"] == u("/article")
    assert article["metadata"]["json_ld"][0]["headline"] == "Ein Artikel"
    assert s["cp1252"].outputs["data"]["h1"] == "Caf\u00e9 \u2013 \u201cquoted\u201d \u20ac5"
    assert s["cp1252"].outputs["source"]["encoding"] == "windows-1252"
    assert s["sjis"].outputs["data"]["h1"] == "日本語のページです。東京都港区"
    assert s["sjis_detect"].outputs["data"]["h1"] == "日本語のページです。東京都港区"
    for k in ("gzip", "deflate", "brotli"):
        assert s[k].outputs["data"]["h1"] == "Ein Artikel", k
    chain = s["chain"].outputs["source"]
    assert chain["final_url"] == u("/article")
    assert chain["redirects"] == [u("/redirect/2"), u("/redirect/1"), u("/article")]
    assert s["ua"].outputs["data"]["h1"] == "mybot/2.0"

    changed = s["changed"]
    assert changed.outputs["data"] == {"title": None, "items": []}
    assert {(w["code"], w["field"]) for w in changed.warnings} == {
        ("field_missing", "title"),
        ("field_missing", "items"),
    }
    assert any("'.product'" in w["message"] for w in changed.warnings)
    # robots.txt was fetched once for all of these pages.
    assert site.count("/robots.txt") == 1


async def test_permanent_failures_fail_after_one_attempt(scrape: Stack, site: FixtureSite) -> None:
    u = site.url
    bad_spec = {"fields": {"t": {"selector": "h1[["}}}
    result, _ = await run(
        scrape,
        [
            step("notfound", u("/nothing-here")),
            step("gone", u("/gone")),
            step("forbidden", u("/forbidden")),
            step("auth", u("/auth")),
            step("robots", u("/private/secret")),
            step("robots_ua", u("/ua?blocked"), input={"user_agent": "BlockedBot/1.0"}),
            step("big", u("/big")),
            step("big_chunked", u("/big?chunked")),
            step("json", u("/json")),
            # through a reference: written out, the pipeline check refuses it at start
            step("bad_spec", u("/list?never"), "${{ inputs.bad_spec }}"),
        ],
        inputs={"bad_spec": bad_spec},
    )
    codes = {k: (v.status, v.error_code, v.attempts) for k, v in result.steps.items()}
    assert codes == {
        "notfound": ("failed", "not_found", 1),
        "gone": ("failed", "not_found", 1),
        "forbidden": ("failed", "access_denied", 1),
        "auth": ("failed", "access_denied", 1),
        "robots": ("failed", "access_denied", 1),
        "robots_ua": ("failed", "access_denied", 1),
        "big": ("failed", "payload_too_large", 1),
        "big_chunked": ("failed", "payload_too_large", 1),
        "json": ("failed", "invalid_input", 1),
        "bad_spec": ("failed", "invalid_input", 1),
    }
    assert "extraction_spec.fields.t.selector" in (result.steps["bad_spec"].error_message or "")
    # Refused before any request: robots and a bad spec never reach the page.
    assert site.count("/private/secret") == 0
    assert site.count("/ua?blocked") == 0
    assert site.count("/list?never") == 0


async def test_user_regexes_run_in_linear_time(scrape: Stack) -> None:
    """``^(a+)+$`` against 29 ``a``s and a ``b`` (11 s on Python's ``re``) finishes
    well inside a 3 s deadline; a pattern RE2 refuses is ``invalid_input`` naming
    the field and the engine, before any request."""
    evil = "a" * 29 + "b"
    page = f"<html><body><h1>{evil}</h1><p>price 42 EUR</p></body></html>".encode()
    with serve(lambda ex: ex.send(200, page)) as server:
        result, handle = await run(
            scrape,
            [
                step(
                    "redos",
                    server.url("/evil"),
                    {"fields": {"h": {"selector": "h1", "regex": "^(a+)+$"}}},
                    timeout_seconds=3,
                ),
                step(
                    "group",
                    server.url("/evil"),
                    {"fields": {"n": {"selector": "p", "regex": "(\\d+)", "type": "integer"}}},
                    timeout_seconds=3,
                ),
                # through a reference: written out, the pipeline check refuses it at start
                step("backref", server.url("/never"), "${{ inputs.backref }}"),
            ],
            inputs={"backref": {"fields": {"h": {"selector": "h1", "regex": "(a)\\1"}}}},
        )
    codes = {k: (v.status, v.error_code, v.attempts) for k, v in result.steps.items()}
    assert codes == {
        "redos": ("succeeded", None, 1),
        "group": ("succeeded", None, 1),
        "backref": ("failed", "invalid_input", 1),
    }
    assert result.steps["redos"].outputs["data"]["h"] is None
    assert result.steps["group"].outputs["data"]["n"] == 42
    message = result.steps["backref"].error_message or ""
    assert "extraction_spec.fields.h.regex" in message
    assert "RE2 (linear time, no backreferences or lookaround)" in message
    assert await workflow_task_failures(handle) == 0


async def test_transient_failures_are_retried_by_temporal(scrape: Stack, site: FixtureSite) -> None:
    u = site.url
    result, handle = await run(
        scrape,
        [
            step("flaky", u("/flaky?k=1"), LISTING_SPEC),
            step("limited", u("/ratelimited?k=1&retry=1"), LISTING_SPEC),
            step("limited_date", u("/ratelimited?k=2&retry=date"), LISTING_SPEC),
            step("down", u("/down")),
            step("loop", u("/loop/a")),
            step("slow", u("/slow?s=30"), timeout_seconds=1.5),
        ],
    )
    codes = {k: (v.status, v.error_code, v.attempts) for k, v in result.steps.items()}
    assert codes == {
        "flaky": ("succeeded", None, 2),
        "limited": ("succeeded", None, 2),
        "limited_date": ("succeeded", None, 2),
        "down": ("failed", "fetch_failed", 2),
        "loop": ("failed", "fetch_failed", 2),
        "slow": ("failed", "fetch_timeout", 2),
    }
    assert result.steps["flaky"].outputs["data"]["title"] == "Products"
    assert "redirect loop" in (result.steps["loop"].error_message or "")

    # The retry of each 429 waited for Retry-After: the failure Temporal recorded
    # for attempt 1 carries it as next_retry_delay.
    delays: dict[str, float] = {}
    history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = a.input.payloads[0].data.decode()
        if e.HasField("activity_task_started_event_attributes"):
            a2 = e.activity_task_started_event_attributes
            info = a2.last_failure.application_failure_info
            if a2.attempt == 2 and info.type == "rate_limited":
                key = "k=1" if "k=1" in scheduled[a2.scheduled_event_id] else "k=2"
                delays[key] = info.next_retry_delay.ToTimedelta().total_seconds()
    assert delays["k=1"] == 1.0
    assert 0 < delays["k=2"] <= 2.0


async def test_egress_denied_on_every_redirect_hop(
    client: Client, site: FixtureSite, tmp_path: Path
) -> None:
    """Private networks off; only the fixture site's exact address and port trusted."""
    settings = make_settings(tmp_path, private=False)

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host == "site.test" else ["93.184.215.14"]

    egress = EgressPolicy.from_settings(
        settings, trusted_endpoints=[("127.0.0.1", site.port)], resolver=resolver
    )
    tools = scrape_tools(settings, egress=egress)
    named = f"http://site.test:{site.port}"
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            result, _ = await run(
                stack,
                [
                    step("trusted", site.url("/article")),
                    step("by_name", named + "/article"),
                    step("metadata", site.url("/to-metadata")),
                    step("private", site.url("/to-private")),
                    step("loopback6", site.url("/to-loopback")),
                    step("other_port", f"http://127.0.0.1:{site.port + 1}/"),
                    step("narrowed", named + "/article", input={"allow_domains": ["else.test"]}),
                ],
            )
    finally:
        await tools["fetch_url"].aclose()
    codes = {k: (v.status, v.error_code, v.attempts) for k, v in result.steps.items()}
    assert codes == {
        "trusted": ("succeeded", None, 1),
        "by_name": ("succeeded", None, 1),
        "metadata": ("failed", "egress_denied", 1),
        "private": ("failed", "egress_denied", 1),
        "loopback6": ("failed", "egress_denied", 1),
        "other_port": ("failed", "egress_denied", 1),
        "narrowed": ("failed", "egress_denied", 1),
    }
    assert "metadata" in (result.steps["metadata"].error_message or "")


async def test_breaker_opens_per_host_and_fails_fast(
    client: Client, site: FixtureSite, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, private=True)
    breakers = BreakerRegistry("host", failure_threshold=2, open_seconds=60)
    tools = scrape_tools(settings, breakers=breakers)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            first, _ = await run(stack, [step("down", site.url("/down?breaker"))])
            hits = site.count("/article")
            second, _ = await run(
                stack, [step("after", site.url("/article"), retry={"max_attempts": 1})]
            )
    finally:
        await tools["fetch_url"].aclose()
    assert (first.steps["down"].error_code, first.steps["down"].attempts) == ("fetch_failed", 2)
    assert breakers.state(f"127.0.0.1:{site.port}") == "open"
    after = second.steps["after"]
    assert (after.error_code, after.attempts) == ("circuit_open", 1)
    assert site.count("/article") == hits  # failed fast: no request reached the site


def test_spec_contract() -> None:
    spec = get_spec("web-scrape")
    assert spec.task_queue == "aiworker-scrape"
    assert spec.constraints.timeout_seconds == 60
    assert {"fetch_url", "parse_html"} <= set(spec.constraints.tools_allowed)
    assert spec.constraints.rate_limit == "10/min"
    assert (spec.retries.max_attempts, spec.retries.backoff) == (2, "exponential")
