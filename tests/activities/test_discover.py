"""``discover`` on web-scrape steps, end to end: a real Temporal server, the real
worker runtime and tools, a loopback site with sitemaps (tests/fixtures/sitemap_site.py).

Most behaviours run as parallel steps of one pipeline; the last test feeds a
discovery into a ``for_each``. ``aiworker check`` refuses a bad ``discover``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack
from fixtures.sitemap_site import MILLION, SitemapSite, sitemap_site  # noqa: F401
from fixtures.sitemap_site import index as index_doc
from fixtures.sitemap_site import urlset as urlset_doc
from support.loopback import Exchange, serve
from support.payloads import stack_settings
from support.scraping import scrape_stack
from temporalio.client import Client

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.tools.discover import SITEMAP_MAX_BYTES
from aiworker.config.settings import parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
H1 = {"fields": {"h1": {"selector": "h1", "required": True}}}


@pytest.fixture(scope="module")
def client(env: Any) -> Client:
    c: Client = env.client
    return c


@pytest_asyncio.fixture(scope="module")
async def stack(client: Client, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("discover"),
        rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")),
    )
    breakers = BreakerRegistry("host", failure_threshold=10_000)
    async with scrape_stack(client, settings, breakers=breakers) as s:
        yield s


def step(sid: str, url: str, discover: dict[str, Any], **inp: Any) -> dict[str, Any]:
    return {
        "id": sid,
        "worker": "web-scrape",
        "input": {"url": url, "discover": discover, **inp},
        "on_failure": "continue",
    }


async def run(stack: Stack, steps: list[dict[str, Any]], **extra: Any) -> PipelineResult:
    pipeline = {"name": "discover-test", "tenant": "acme", "steps": steps, **extra}
    handle = await stack.start(pipeline)
    result: PipelineResult = await handle.result()
    return result


def codes(warnings: list[dict[str, Any]]) -> dict[str, str]:
    return {w["code"]: w["message"] for w in warnings}


async def test_sitemaps_and_links_are_discovered_filtered_and_bounded(
    stack: Stack, sitemap_site: SitemapSite
) -> None:
    u = sitemap_site.url
    result = await run(
        stack,
        [
            step("index", u("/"), {"sitemap": True}),
            step(
                "links",
                u("/links"),
                {"links": {"selector": "a.product, div.product"}, "pattern": "/item/[0-9]+$"},
            ),
            step(
                "any_site",
                u("/links"),
                {
                    "links": {"selector": "a.product, div.product"},
                    "pattern": "/item/[0-9]+$",
                    "same_site": False,
                },
            ),
            step("million", u("/"), {"sitemap": u("/million.xml"), "max_urls": 500}),
            step("bomb", u("/"), {"sitemap": u("/bomb.xml.gz")}),
            step("nested", u("/"), {"sitemap": u("/nested.xml")}),
            step("encoded", u("/"), {"sitemap": u("/encoded.xml")}),
            step("missing", u("/"), {"sitemap": u("/nope.xml")}),
            step("not_xml", u("/"), {"sitemap": u("/not-xml.xml")}),
            step("shop", u("/shop"), {"links": {"selector": "a.product"}}, extraction_spec=H1),
        ],
    )
    s = result.steps
    assert {k: (v.status, v.error_code, v.attempts) for k, v in s.items()} == {
        "index": ("succeeded", None, 1),
        "links": ("succeeded", None, 1),
        "any_site": ("succeeded", None, 1),
        "million": ("succeeded", None, 1),
        "bomb": ("partial", None, 1),
        "nested": ("partial", None, 1),
        "encoded": ("succeeded", None, 1),
        "missing": ("failed", "not_found", 1),
        "not_xml": ("partial", None, 1),
        "shop": ("succeeded", None, 1),
    }

    # robots.txt's Sitemap: line -> an index of two gzip sitemaps (application/gzip and
    # x-gzip); duplicates and fragments gone, order kept, the relative entries resolved.
    index = s["index"].outputs
    assert index["data"]["urls"] == [u(f"/p/{i}") for i in range(1, 7)]
    warned = codes(index["warnings"])
    assert warned["urls_disallowed"].startswith("2 URL(s) dropped: robots.txt disallows")
    assert warned["urls_dropped"].startswith("1 URL(s) dropped: they are on another site")
    assert index["source"]["final_url"] == u("/sitemap_index.xml")
    assert s["index"].artifacts == []  # the page itself was not fetched
    assert sitemap_site.count("/") == 0

    # links: the selector's matches (a div gives the links inside it), the RE2 pattern,
    # robots.txt (of the other site too, when same_site is false).
    assert s["links"].outputs["data"]["urls"] == [u("/item/1"), u("/item/2"), u("/item/7")]
    assert set(codes(s["links"].outputs["warnings"])) == {"urls_disallowed", "urls_dropped"}
    other = sitemap_site.other
    assert s["any_site"].outputs["data"]["urls"] == [
        u("/item/1"),
        u("/item/2"),
        other("/item/4"),
        u("/item/7"),
    ]
    warned = codes(s["any_site"].outputs["warnings"])
    assert set(warned) == {"urls_disallowed"} and warned["urls_disallowed"].startswith("2 URL")

    # a million-entry sitemap, written as it is read: reading stops at max_urls.
    million = s["million"].outputs
    assert million["data"]["urls"] == [u(f"/m/{i}") for i in range(500)]
    assert "max_urls (500)" in codes(million["warnings"])["max_urls"]
    assert sitemap_site.sent < MILLION // 2

    # a gzip bomb: the decompression cap ends it; the URLs before it are kept.
    bomb = s["bomb"]
    assert bomb.outputs["data"]["urls"] == [u(f"/b/{i}") for i in range(3)]
    assert f"{SITEMAP_MAX_BYTES}-byte" in codes(bomb.outputs["warnings"])["sitemap_truncated"]
    assert sitemap_site.bomb_raw < 5 * 1024 * 1024
    assert [w["code"] for w in bomb.warnings] == ["sitemap_truncated"]

    # an index inside an index is not followed (depth 1)
    nested = s["nested"].outputs
    assert nested["data"]["urls"] == []
    assert "reads one level" in codes(nested["warnings"])["sitemap_depth"]
    assert sitemap_site.count("/sitemaps/a.xml.gz") == 1  # only through the index step

    assert s["encoded"].outputs["data"]["urls"] == [u("/e/1"), u("/e/2")]
    assert "is not a valid sitemap" in codes(s["not_xml"].outputs["warnings"])["sitemap_invalid"]
    shop = s["shop"].outputs
    assert shop["data"] == {"h1": "Shop", "urls": [u(f"/item/{i}") for i in (1, 2, 3)]}
    assert len(s["shop"].artifacts) == 1


async def test_a_discovery_feeds_a_for_each(stack: Stack, sitemap_site: SitemapSite) -> None:
    u = sitemap_site.url
    result = await run(
        stack,
        [
            {
                "id": "find",
                "worker": "web-scrape",
                "input": {"url": u("/shop"), "discover": {"links": True, "pattern": "/item/"}},
            },
            {
                "id": "each",
                "worker": "web-scrape",
                "depends_on": ["find"],
                "for_each": "${{ steps.find.outputs.data.urls }}",
                "input": {"url": "${{ item }}", "extraction_spec": H1},
            },
        ],
        output={"urls": "${{ steps.find.outputs.data.urls }}"},
    )
    assert result.status == "succeeded", result
    assert result.output == {"urls": [u(f"/item/{i}") for i in (1, 2, 3)]}
    items = result.steps["each"].outputs
    titles = [item["data"]["h1"] for item in items["items"]] if isinstance(items, dict) else None
    assert titles == ["Item 1", "Item 2", "Item 3"], items


def check(
    tmp_path: Path, inp: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> tuple[int, Any]:
    pipeline = {
        "name": "p",
        "tenant": "acme",
        "steps": [{"id": "find", "worker": "web-scrape", "input": inp}],
    }
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline))
    rc = cli.main(["check", "--json", str(f)])
    return rc, json.loads(capsys.readouterr().out)


def test_check_refuses_a_bad_discover_naming_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "https://shop.example/"
    rc, problems = check(
        tmp_path, {"url": url, "discover": {"links": True, "pattern": "(a"}}, capsys
    )
    assert rc == 2
    [p] = problems
    assert p["path"] == "steps[0].input.discover.pattern" and "RE2" in p["message"]
    rc, problems = check(tmp_path, {"url": url, "discover": {"links": {"selector": "a[["}}}, capsys)
    assert (rc, problems[0]["path"]) == (2, "steps[0].input.discover.links.selector")
    assert "invalid CSS selector" in problems[0]["message"]
    rc, problems = check(tmp_path, {"url": url, "discover": {"same_site": False}}, capsys)
    assert (rc, problems[0]["path"]) == (2, "steps[0].input.discover")
    assert 'set "sitemap", "links" or both' in problems[0]["message"]
    rc, problems = check(
        tmp_path, {"url": url, "discover": {"links": True, "max_urls": 10001}}, capsys
    )
    assert (rc, problems[0]["path"]) == (2, "steps[0].input.discover.max_urls")
    rc, problems = check(tmp_path, {"url": url}, capsys)
    assert (rc, problems[0]["path"]) == (2, "steps[0].input")
    assert "extraction_spec, discover or both" in problems[0]["message"]
    rc, problems = check(tmp_path, {"url": url, "discover": {"sitemap": True}}, capsys)
    assert (rc, problems) == (0, [])


async def test_the_example_pipeline_crawls_the_sample_shop(stack: Stack) -> None:
    """examples/pipelines/discover.json, as docs/scrape-discovery.md runs it, against
    the bundled sample shop (served on loopback instead of python -m http.server)."""
    site = ROOT / "workers" / "samples" / "site"

    def handle(ex: Exchange) -> None:
        page = site / ex.path.lstrip("/")
        if ex.path.count("/") != 1 or not page.is_file():
            return ex.send(404, b"nope")
        ctype = "text/plain" if page.suffix == ".txt" else "text/html; charset=utf-8"
        ex.send(200, page.read_bytes(), ctype)

    pipeline = json.loads((ROOT / "examples" / "pipelines" / "discover.json").read_text())
    with serve(handle) as server:
        pipeline["inputs"]["url"] = server.url("/index.html")
        handle_ = await stack.start(pipeline)
        result: PipelineResult = await handle_.result()
    assert result.status == "succeeded", result
    pages = ["espresso.html", "grinder.html", "kettle.html"]
    assert result.output["urls"] == [server.url(f"/{p}") for p in pages]
    names = [item["data"]["name"] for item in result.output["products"]["items"]]
    assert names == ["Espresso machine", "Burr grinder", "Gooseneck kettle"]


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(),
    reason="Chromium is not installed: apt-get install chromium (Debian's package)",
)
async def test_links_of_a_rendered_page(stack: Stack, sitemap_site: SitemapSite) -> None:
    """With render: "browser", links come from the DOM the scripts built."""
    u = sitemap_site.url
    inp = {"render": "browser", "wait_for": "a.product"}
    plain, rendered = (
        step(sid, u("/js-links"), {"links": {"selector": "a.product"}}, **extra)
        for sid, extra in (("plain", {}), ("rendered", inp))
    )
    result = await run(stack, [plain, rendered])
    assert result.steps["plain"].outputs["data"]["urls"] == []
    assert result.steps["rendered"].outputs["data"]["urls"] == [u("/item/1"), u("/item/2")]
    assert result.steps["rendered"].usage.external_calls == 1


async def test_same_site_reads_no_sitemap_of_another_site(stack: Stack) -> None:
    """Issue 31: robots.txt, a sitemap index and the step's own ``sitemap`` may name
    sitemaps of another site; under ``same_site`` (the default) none is fetched.
    Two loopback servers: the step's site on 127.0.0.1, the other as ``localhost``
    on another port, which counts every request it gets."""
    other_hits: list[str] = []

    def other(h: Exchange) -> None:
        other_hits.append(h.path)
        h.send(200, index_doc([]), "application/xml")

    with serve(other) as elsewhere:
        far = f"http://localhost:{elsewhere.port}"

        def home(h: Exchange) -> None:
            if h.path == "/robots.txt":
                robots = f"User-agent: *\nSitemap: {far}/robots-named.xml\n"
                return h.send(200, robots.encode(), "text/plain")
            if h.path == "/index.xml":
                children = [f"{far}/child.xml", mine.url("/mine.xml")]
                return h.send(200, index_doc(children), "application/xml")
            if h.path == "/mine.xml":
                return h.send(200, urlset_doc([mine.url("/p/1")]), "application/xml")
            if h.path == "/sitemap.xml":
                return h.send(200, urlset_doc([mine.url("/p/2")]), "application/xml")
            if h.path == "/moved.xml":
                return h.send(302, b"", "text/plain", {"Location": f"{far}/moved.xml"})
            return h.send(404, b"nope")

        with serve(home) as mine:
            u = mine.url
            result = await run(
                stack,
                [
                    step("robots", u("/"), {"sitemap": True}),
                    step("index", u("/"), {"sitemap": u("/index.xml")}),
                    step("named", u("/"), {"sitemap": f"{far}/named.xml"}),
                    step("moved", u("/"), {"sitemap": u("/moved.xml")}),
                    step("allowed", u("/"), {"sitemap": f"{far}/named.xml", "same_site": False}),
                ],
            )
    s = result.steps
    # robots.txt names only another site's sitemap: /sitemap.xml of the site is read instead
    assert s["robots"].outputs["data"]["urls"] == [u("/p/2")]
    assert "sitemap_other_site" in codes(s["robots"].outputs["warnings"])
    # the index's child on the other site is skipped, the site's own is read
    assert s["index"].outputs["data"]["urls"] == [u("/p/1")]
    assert (
        f"{far}/child.xml not read" in codes(s["index"].outputs["warnings"])["sitemap_other_site"]
    )
    # a sitemap named on another site is refused, not fetched
    assert (s["named"].status, s["named"].error_code) == ("failed", "invalid_input")
    assert s["allowed"].status == "succeeded"
    # a sitemap that redirects to another site: its one request, then refused
    assert (s["moved"].status, s["moved"].error_code) == ("failed", "access_denied")
    assert "redirects to another site" in (s["moved"].error_message or "")
    # the other site saw only the step that allows it (and the redirect's one request)
    assert other_hits.count("/named.xml") == 1
    assert set(other_hits) <= {"/named.xml", "/moved.xml", "/robots.txt"}
    assert "/robots-named.xml" not in other_hits and "/child.xml" not in other_hits
