"""Conditional requests of the web-scrape worker, through the worker runtime
against loopback sites that implement ETag and Last-Modified, always answer
304, or ignore every condition (``tests/fixtures/conditional_site.py``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import running_stack
from fixtures.conditional_site import ConditionalSite, Page
from fixtures.s3 import MotoS3, bucket, conn, moto_s3  # noqa: F401  (fixtures)
from support.loopback import serve
from support.payloads import stack_settings
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from aiworker.activities.artifacts_s3 import S3ArtifactStore, S3Connection
from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.lineage import FileLineageIndex, RecordingArtifactStore
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.step_cache import FileCacheBackend, S3CacheBackend
from aiworker.activities.tools import scrape_tools
from aiworker.activities.tools.revalidate import MAX_PER_SHARD, PageValidators, canonical_url
from aiworker.activities.web_scrape import WebScrape
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.protocol import WorkerResponse

H1 = {"fields": {"h1": {"selector": "h1", "required": True}}}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return stack_settings(tmp_path, rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")))


@pytest_asyncio.fixture
async def runtime(settings: Settings) -> AsyncIterator[WorkerRuntime]:
    tools = scrape_tools(settings, breakers=BreakerRegistry("host", failure_threshold=10_000))
    try:
        yield WorkerRuntime(settings, load_specs(), tools=tools)
    finally:
        await tools["fetch_url"].aclose()


def _site(mode: str = "correct", **pages: Page) -> Iterator[tuple[ConditionalSite, str]]:
    site = ConditionalSite(mode, {f"/{name}": page for name, page in pages.items()})
    with serve(site.handle) as server:
        yield site, server.base_url


@pytest.fixture
def site() -> Iterator[tuple[ConditionalSite, str]]:
    yield from _site(
        etag=Page(),
        lm=Page(etag=None, last_modified=True),
        weak=Page(etag="weak"),
        huge=Page(etag="huge"),
        big=Page(filler=9000),
        bare=Page(etag=None),
    )


async def scrape(
    runtime: WorkerRuntime,
    url: str,
    *,
    tenant: str = "acme",
    spec: dict[str, Any] = H1,
    **extra: Any,
) -> WorkerResponse:
    request = {
        "worker_id": "web-scrape",
        "idempotency_key": f"wf/{url}",
        "tenant": tenant,
        "input": {"url": url, "extraction_spec": spec, **extra},
    }
    return await runtime.run(WebScrape(), request)


async def test_an_unchanged_page_costs_one_conditional_request_answered_304(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str]
) -> None:
    s, base = site
    first = await scrape(runtime, base + "/etag")
    second = await scrape(runtime, base + "/etag")
    assert [(h.if_none_match, h.status) for h in s.page_hits("/etag")][:2] == [
        (None, 200),
        ('"v1"', 304),
    ]
    assert first.outputs["source"]["not_modified"] is False
    assert second.status == "succeeded"
    assert second.outputs["data"] == first.outputs["data"] == {"h1": "version 1"}
    many = {"fields": {"title": "title", "h1": "h1"}}
    ordered = [await scrape(runtime, base + "/etag", spec=many) for _ in range(2)]
    assert [list(r.outputs["data"]) for r in ordered] == [["title", "h1"]] * 2
    src = second.outputs["source"]
    assert src["not_modified"] is True and src["status_code"] == 304
    assert src["previous_fetched_at"] == first.outputs["source"]["fetched_at"]
    assert src["sha256"] == first.outputs["source"]["sha256"]
    # the previous page's artifact, and a 304 still counts one external call
    assert second.artifacts == first.artifacts
    assert first.usage.external_calls == second.usage.external_calls == 1

    # Last-Modified alone: If-Modified-Since, sent as the server wrote it
    await scrape(runtime, base + "/lm")
    again = await scrape(runtime, base + "/lm")
    [_, hit] = s.page_hits("/lm")
    assert (hit.if_modified_since, hit.if_none_match, hit.status) == (
        "Sat, 02 Mar 2024 12:00:00 GMT",
        None,
        304,
    )
    assert again.outputs["source"]["not_modified"] is True

    # a weak ETag goes back as given
    await scrape(runtime, base + "/weak")
    await scrape(runtime, base + "/weak")
    assert [h.if_none_match for h in s.page_hits("/weak")] == [None, 'W/"v1"']


async def test_a_changed_page_is_extracted_anew_with_its_new_validators(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str]
) -> None:
    s, base = site
    await scrape(runtime, base + "/etag")
    s.pages["/etag"].version = 2
    changed = await scrape(runtime, base + "/etag")
    after = await scrape(runtime, base + "/etag")
    assert [(h.if_none_match, h.status) for h in s.page_hits("/etag")] == [
        (None, 200),
        ('"v1"', 200),
        ('"v2"', 304),
    ]
    assert changed.outputs["data"] == {"h1": "version 2"}
    assert changed.outputs["source"]["not_modified"] is False
    assert after.outputs["data"] == {"h1": "version 2"}
    assert after.outputs["source"]["not_modified"] is True


async def test_cache_off_sends_no_condition_and_remembers_nothing(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str], settings: Settings
) -> None:
    s, base = site
    for _ in range(2):
        r = await scrape(runtime, base + "/etag", cache="off")
        assert r.outputs["source"]["not_modified"] is False
    assert [(h.conditional, h.status) for h in s.page_hits("/etag")] == [(False, 200)] * 2
    assert not (settings.data_dir / "revalidate").exists()
    # with it on again, nothing was remembered: the next fetch asks no condition
    await scrape(runtime, base + "/etag")
    assert not s.page_hits("/etag")[-1].conditional


async def test_entries_are_per_tenant_and_per_extraction_spec(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str], settings: Settings
) -> None:
    s, base = site
    await scrape(runtime, base + "/etag", tenant="acme")
    other = await scrape(runtime, base + "/etag", tenant="globex")
    title = {"fields": {"title": {"selector": "title", "required": True}}}
    by_spec = await scrape(runtime, base + "/etag", spec=title)
    assert [h.conditional for h in s.page_hits("/etag")] == [False, False, False]
    assert other.outputs["data"] == {"h1": "version 1"}
    assert by_spec.outputs["data"] == {"title": "v1"}
    # each has its own entry now; the canonical URL finds acme's
    again = await scrape(runtime, base.replace("127.0.0.1", "127.0.0.1") + "/etag#top")
    assert again.outputs["source"]["not_modified"] is True
    assert again.outputs["data"] == {"h1": "version 1"}
    entries = settings.data_dir / "revalidate"
    assert sorted(p.name for p in entries.iterdir()) == ["acme", "globex"]
    assert len(list((entries / "acme").rglob("*.json"))) == 2


async def test_a_partial_extraction_is_not_remembered(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str]
) -> None:
    s, base = site
    missing = {"fields": {"price": {"selector": ".price", "required": True}}}
    for _ in range(2):
        r = await scrape(runtime, base + "/etag", spec=missing)
        assert r.status == "partial"
    assert [h.conditional for h in s.page_hits("/etag")] == [False, False]


async def test_validators_that_cannot_go_back_are_not_kept(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str], settings: Settings
) -> None:
    s, base = site
    for path in ("/huge", "/bare"):
        await scrape(runtime, base + path)
        r = await scrape(runtime, base + path)
        assert r.outputs["source"]["not_modified"] is False
        assert [h.conditional for h in s.page_hits(path)] == [False, False]
    assert not (settings.data_dir / "revalidate").exists()


async def test_a_server_that_ignores_conditions_gets_them_and_answers_200(
    runtime: WorkerRuntime,
) -> None:
    for s, base in _site("ignore", etag=Page()):
        await scrape(runtime, base + "/etag")
        s.pages["/etag"].version = 2
        r = await scrape(runtime, base + "/etag")
        assert [(h.if_none_match, h.status) for h in s.page_hits("/etag")] == [
            (None, 200),
            ('"v1"', 200),
        ]
        assert r.outputs["data"] == {"h1": "version 2"}
        assert r.outputs["source"]["not_modified"] is False


async def test_a_304_without_an_entry_is_refetched_once_then_fetch_failed(
    runtime: WorkerRuntime,
) -> None:
    for s, base in _site("always304", etag=Page()):
        with pytest.raises(ApplicationError) as e:
            await scrape(runtime, base + "/etag")
        assert (e.value.type, e.value.non_retryable) == ("fetch_failed", False)
        assert "304 Not Modified to a request that asked no condition" in str(e.value)
        assert e.value.details[0]["context"]["reason"] == "unexpected_not_modified"
        # exactly one re-fetch, both unconditional: no loop
        assert [(h.conditional, h.status) for h in s.page_hits("/etag")] == [(False, 304)] * 2


async def test_a_304_whose_stored_outputs_are_gone_is_refetched_unconditionally(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str], settings: Settings
) -> None:
    s, base = site
    many = {"fields": {**H1["fields"], "paras": {"selector": "p.f", "many": True}}}
    first = await scrape(runtime, base + "/big", spec=many)
    assert len(json.dumps(first.outputs)) > 256 * 1024  # outputs kept as an artifact
    [entry_file] = (settings.data_dir / "revalidate").rglob("*.json")
    entry = json.loads(entry_file.read_bytes())
    assert "outputs" not in entry and entry["outputs_ref"]["media_type"] == "application/json"
    assert entry["validators"] == {"etag": '"v1"'}
    # served from the stored artifact
    second = await scrape(runtime, base + "/big", spec=many)
    assert second.outputs["source"]["not_modified"] is True
    assert second.outputs["data"] == first.outputs["data"]
    # pruned: the 304 is followed by one unconditional fetch
    await asyncio.to_thread(Path(entry["outputs_ref"]["uri"].removeprefix("file://")).unlink)
    third = await scrape(runtime, base + "/big", spec=many)
    assert [(h.conditional, h.status) for h in s.page_hits("/big")] == [
        (False, 200),
        (True, 304),
        (True, 304),
        (False, 200),
    ]
    assert third.outputs["source"]["not_modified"] is False
    assert third.outputs["data"] == first.outputs["data"]
    assert third.usage.external_calls == 1


async def test_the_condition_goes_to_the_url_that_issued_it(
    runtime: WorkerRuntime, site: tuple[ConditionalSite, str]
) -> None:
    s, base = site
    await scrape(runtime, base + "/moved")
    r = await scrape(runtime, base + "/moved")
    assert [h.conditional for h in s.page_hits("/moved")] == [False, False]
    assert [(h.if_none_match, h.status) for h in s.page_hits("/etag")] == [
        (None, 200),
        ('"v1"', 304),
    ]
    assert r.outputs["source"]["not_modified"] is True
    assert r.outputs["source"]["redirects"] == [base + "/etag"]


def test_canonical_urls() -> None:
    assert canonical_url("HTTP://Shop.Example:80/a?b=1#frag") == "http://shop.example/a?b=1"
    assert canonical_url("https://shop.example:8443") == "https://shop.example:8443/"


def test_a_shard_keeps_a_bounded_number_of_entries(tmp_path: Path) -> None:
    backend = FileCacheBackend(tmp_path, area="revalidate", max_per_shard=3)
    for i in range(5):
        backend._write(backend.path_for("acme", f"ab{i:062d}"), b"{}", 1000.0 + i, 5000.0 + i)
    left = sorted(p.stem[:3] + p.stem[-1] for p in (tmp_path / "revalidate").rglob("*.json"))
    assert left == ["ab02", "ab03", "ab04"]


async def test_a_scheduled_pipeline_rerun_costs_one_304_on_temporal(
    client: Client, settings: Settings, site: tuple[ConditionalSite, str]
) -> None:
    """The product-watch case: the same pipeline twice on a real Temporal server;
    the second run asks once, conditionally, gets a 304, and its validator and
    output read the previous extraction."""
    s, base = site
    pipeline = {
        "name": "watch",
        "tenant": "acme",
        "inputs": {"url": base + "/etag"},
        "steps": [
            {"id": "scrape", "worker": "web-scrape",
             "input": {"url": "${{ inputs.url }}", "extraction_spec": H1}},
            {"id": "check", "worker": "validator", "depends_on": ["scrape"],
             "input": {"data": "${{ steps.scrape.outputs.data }}",
                       "schema": {"type": "object", "required": ["h1"]}}},
        ],
        "output": {"h1": "${{ steps.scrape.outputs.data.h1 }}",
                   "unchanged": "${{ steps.scrape.outputs.source.not_modified }}"},
    }  # fmt: skip
    tools = scrape_tools(settings, breakers=BreakerRegistry("host", failure_threshold=10_000))
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            first = await (await stack.start(pipeline)).result()
            seen = len(s.page_hits("/etag"))
            second = await (await stack.start(pipeline)).result()
    finally:
        await tools["fetch_url"].aclose()
    assert seen == 1
    assert [(h.if_none_match, h.status) for h in s.page_hits("/etag")[seen:]] == [('"v1"', 304)]
    assert (first.status, second.status) == ("succeeded", "succeeded")
    assert first.output == {"h1": "version 1", "unchanged": False}
    assert second.output == {"h1": "version 1", "unchanged": True}
    assert second.steps["check"].status == "succeeded"
    assert second.steps["scrape"].artifacts == first.steps["scrape"].artifacts
    assert second.usage.external_calls == first.usage.external_calls == 1


async def test_s3_entries_sit_beside_the_artifacts_bounded_per_shard(
    moto_s3: MotoS3, bucket: str, conn: S3Connection
) -> None:
    store = RecordingArtifactStore(S3ArtifactStore(conn, bucket, "art"), FileLineageIndex(Path()))
    backend = PageValidators.beside(store, Path("/nonexistent")).backend
    assert isinstance(backend, S3CacheBackend)
    assert (backend.area, backend.max_per_shard) == ("_revalidate", MAX_PER_SHARD)
    backend.max_per_shard = 2
    keys = [f"cd{i:062d}" for i in range(3)]
    for key in keys:
        await backend.write("acme", key, b"{}", now=time.time(), ttl=60)
    page = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="art/_revalidate/acme/cd/")
    left = [o["Key"].rsplit("/", 1)[1] for o in page.get("Contents", [])]
    assert len(left) == 2 and f"{keys[-1]}.json" in left
    assert await backend.read("acme", keys[-1]) == b"{}"
    assert await backend.read("other", keys[-1]) is None
