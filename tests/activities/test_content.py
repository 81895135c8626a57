"""``extraction_spec.content``: the main text of a page as text and Markdown.

End to end: one pipeline on the real Temporal dev server fetches loopback
pages (a news article with navigation, ads, comments and a footer around it,
a long article, a login wall, an empty JavaScript shell) through the
web-scrape worker, each behaviour a parallel step. ``aiworker check`` refuses
a bad ``content`` or ``max_content_chars`` before anything runs. The bounds
of the extractor (deep nesting, the deadline) are checked on the module.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from bs4 import BeautifulSoup
from conftest import Stack
from fixtures.article_site import (  # noqa: F401  (module fixture)
    FIRST,
    LAST,
    LINK_HREF,
    LINK_TEXT,
    LIST_ITEMS,
    article_site,
)
from support.loopback import Loopback
from support.payloads import stack_settings
from support.scraping import scrape_stack
from temporalio.client import Client

from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import scrape_tools
from aiworker.activities.tools.content import extract_content, main_content
from aiworker.activities.tools.extract import HtmlParser
from aiworker.activities.tools.lxml_tree import LxmlPage
from aiworker.activities.web_scrape import WebScrape
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.cli import main as cli

BOILERPLATE = ("NAVMARK", "ADMARK", "COMMENTMARK", "FOOTMARK")


@pytest.fixture(scope="module")
def client(env: Any) -> Client:
    c: Client = env.client
    return c


@pytest_asyncio.fixture(scope="module")
async def stack(client: Client, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("content"),
        allow_private_networks=True,
        rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")),
    )
    async with scrape_stack(client, settings) as s:
        yield s


def scrape(sid: str, url: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": sid,
        "worker": "web-scrape",
        "input": {"url": url, "extraction_spec": spec},
        "on_failure": "continue",
    }


async def test_content_through_a_pipeline(stack: Stack, article_site: Loopback) -> None:
    u = article_site.url
    pipeline = {
        "name": "content-test",
        "tenant": "acme",
        "steps": [
            scrape("article", u("/news/1"), {"content": "article", "fields": {"h1": "h1"}}),
            scrape("page", u("/news/1"), {"content": "page"}),
            scrape("long", u("/long"), {"content": "article", "max_content_chars": 800}),
            scrape("wall", u("/login-wall"), {"content": "article"}),
            scrape("shell", u("/shell"), {"content": "page"}),
        ],
    }
    handle = await stack.start(pipeline)
    result: PipelineResult = await handle.result()
    steps = result.steps
    assert {k: s.status for k, s in steps.items()} == {
        "article": "succeeded",
        "page": "succeeded",
        "long": "succeeded",
        "wall": "partial",
        "shell": "partial",
    }, {k: s.error_code for k, s in steps.items()}

    # article: the body in, the boilerplate out; fields and content side by side
    out = steps["article"].outputs
    assert out is not None
    data = out["data"]
    assert data["h1"] == "Rivers rise after storm 1"
    content = data["content"]
    assert content["mode"] == "article"
    for text in (content["text"], content["markdown"]):
        assert FIRST in text and LAST in text
        for mark in BOILERPLATE:
            assert mark not in text, (mark, text)
    md = content["markdown"]
    assert "## What happened" in md  # a heading
    assert all(f"- {item}" in md for item in LIST_ITEMS)  # a list
    assert f"[{LINK_TEXT}]({LINK_HREF})" in md  # a link, with its target
    assert "| Station | Level (m) |" in md and "| Upper weir | 4.2 |" in md  # a table
    assert LINK_TEXT in content["text"] and LINK_HREF not in content["text"]
    assert (content["title"], content["byline"], content["published"], content["language"]) == (
        "Rivers rise after storm 1",
        "Jane Doe",
        "2024-03-05",
        "en-GB",
    )
    assert out["warnings"] == []

    # page: everything a reader sees, navigation and comments included
    page = steps["page"].outputs
    assert page is not None
    pc = page["data"]["content"]
    assert pc["mode"] == "page" and "h1" not in page["data"]
    for mark in BOILERPLATE:
        assert mark in pc["text"] and mark in pc["markdown"]
    assert "# Rivers rise after storm 1" in pc["markdown"]
    assert f"[{LINK_TEXT}]({LINK_HREF})" in pc["markdown"]
    assert "window.dataLayer" not in pc["text"] and "font:" not in pc["text"]

    # truncation: both renderings cut, one warning, still a success
    long = steps["long"].outputs
    assert long is not None
    lc = long["data"]["content"]
    assert 0 < len(lc["text"]) <= 800 and 0 < len(lc["markdown"]) <= 800
    assert lc["text"].startswith("Rivers rise after storm 7")
    [warning] = long["warnings"]
    assert warning["code"] == "truncated" and warning["field"] == "content"
    assert "max_content_chars (800)" in warning["message"]

    # a login wall and an empty shell: partial with a warning, never an empty success
    for sid in ("wall", "shell"):
        o = steps[sid].outputs
        assert o is not None
        [w] = o["warnings"]
        assert w["code"] == "no_main_content" and w["field"] == "content", w
        assert "login wall" in w["message"]
    wall = steps["wall"].outputs
    assert wall is not None
    assert len(wall["data"]["content"]["text"].split()) < 20


def test_check_refuses_bad_content_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def step(sid: str, spec: dict[str, Any]) -> dict[str, Any]:
        return scrape(sid, "https://news.example/a", spec)

    doc = {
        "name": "bad-content",
        "tenant": "acme",
        "steps": [
            step("a", {"content": "articel"}),
            step("b", {"content": "page", "max_content_chars": 0}),
            step("c", {"metadata": True, "max_content_chars": 10}),
            step("d", {"content": "article", "fields": {"content": "h1"}}),
            step("ok", {"content": "article", "max_content_chars": 500}),
        ],
    }
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    assert cli.main(["check", "--json", str(f)]) == 2
    problems = json.loads(capsys.readouterr().out)
    assert [(p["step"], p["path"]) for p in problems] == [
        ("a", "steps[0].input.extraction_spec.content"),
        ("b", "steps[1].input.extraction_spec.max_content_chars"),
        ("c", "steps[2].input.extraction_spec.max_content_chars"),
        ("d", "steps[3].input.extraction_spec.fields.content"),
    ]
    messages = [p["message"] for p in problems]
    assert '"articel" is not one of ["article","page"]' in messages[0]
    assert "less than the minimum of 1" in messages[1]
    assert 'needs content: "article" or "page"' in messages[2]
    assert "reserved for content" in messages[3]
    assert all("None" not in m and "True" not in m for m in messages)


def test_pathological_pages_stay_bounded() -> None:
    """Deep nesting (lxml stops at 256 levels), a big table: no error, linear time."""
    deep = "<html><body>" + "<div>" * 50_000 + "<p>deep</p>" + "</div>" * 50_000 + "</body></html>"
    rows = "".join(f"<tr><td>r{i}</td><td>{i}</td></tr>" for i in range(20_000))
    table = f"<html><body><table>{rows}</table></body></html>"
    for page in (deep, table, "", "<<<>>>", "\x00\x01"):
        for mode in ("article", "page"):
            started = time.perf_counter()
            content = extract_content(page, mode, "https://example.com/")
            assert set(content) >= {"text", "markdown", "title", "byline", "published"}
            assert time.perf_counter() - started < 30


async def test_the_deadline_bounds_the_extraction() -> None:
    """Past the step's remaining time the result is partial with content_timeout."""
    rows = "".join(f"<tr><td>row {i}</td><td>{i}</td></tr>" for i in range(30_000))
    page = f"<html><body><article><table>{rows}</table></article></body></html>"
    started = time.perf_counter()
    result = await main_content(page, "article", "https://example.com/", max_chars=None,
                                timeout=0.05)  # fmt: skip
    assert time.perf_counter() - started < 1.0
    assert result.partial and [w["code"] for w in result.warnings] == ["content_timeout"]
    assert "deadline" in result.warnings[0]["message"]
    assert result.content["text"] == ""
    await asyncio.sleep(0)


class _CountingParser(HtmlParser):
    """The real ``parse_html`` tool, counting the page trees it builds (BeautifulSoup's
    or lxml's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.parses = 0

    def parse(self, text: str) -> BeautifulSoup:
        self.parses += 1
        return super().parse(text)

    def parse_lxml(self, text: str) -> LxmlPage | None:
        self.parses += 1
        return super().parse_lxml(text)


async def test_content_only_builds_no_soup(tmp_path: Path, article_site: Loopback) -> None:
    """A content-only spec is extracted by trafilatura alone: no tree of the page is
    built for it (it cost more than the extraction); fields still get theirs, and the
    Markdown is the one trafilatura renders."""
    settings = Settings(data_dir=tmp_path, metrics_port=0, allow_private_networks=True)
    tools = scrape_tools(settings)
    parser = tools["parse_html"] = _CountingParser()
    runtime = WorkerRuntime(settings, load_specs(), tools=tools)
    try:
        for i, (spec, parses) in enumerate(
            [({"content": "article"}, 0), ({"content": "article", "fields": {"h1": "h1"}}, 1)]
        ):
            request = {
                "worker_id": "web-scrape",
                "idempotency_key": f"soup/{i}",
                "tenant": "acme",
                "input": {"url": article_site.url("/news/1"), "extraction_spec": spec},
            }
            before = parser.parses
            resp = await runtime.run(WebScrape(), request)
            assert parser.parses - before == parses
            content = resp.outputs["data"]["content"]
            assert FIRST in content["markdown"] and FIRST in content["text"]
            assert f"[{LINK_TEXT}]({LINK_HREF})" in content["markdown"]
            assert LINK_HREF not in content["text"]
            assert ("h1" in resp.outputs["data"]) == bool(parses)
    finally:
        await tools["fetch_url"].aclose()


async def test_small_pages_are_extracted_inline_when_time_is_ample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page of at most INLINE_CHARS with INLINE_MIN_SECONDS left is extracted on the
    calling thread; a bigger page, or less time, goes to the content pool (where the
    deadline can cut it short)."""
    import threading

    from fixtures.article_site import article_page

    from aiworker.activities.tools import content as content_module

    threads: list[str] = []
    real = content_module.extract_content

    def recording(html: str, mode: str, base_url: str) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return real(html, mode, base_url)

    monkeypatch.setattr(content_module, "extract_content", recording)
    small = article_page(1)
    big = small.replace("</body>", "<!--" + "x" * content_module.INLINE_CHARS + "--></body>")
    ample = content_module.INLINE_MIN_SECONDS + 1
    for page, timeout in ((small, ample), (big, ample), (small, 1.0)):
        result = await main_content(page, "article", "https://example.com/", max_chars=None,
                                    timeout=timeout)  # fmt: skip
        assert FIRST in result.content["text"]
    here = threading.current_thread().name
    assert threads[0] == here
    assert threads[1] != here and threads[2] != here
    assert threads[1].startswith("aiworker-content")
