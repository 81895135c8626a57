"""The crawl bench's pieces (bench/crawl.py): its generated site served from a process
of its own, the pipeline it runs, and the page-by-page field comparison. No timing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
from bs4 import BeautifulSoup

# bench/ lives at the repository root, outside the installed package; appended,
# so nothing installed is shadowed by the root's folders
sys.path.append(str(Path(__file__).resolve().parent.parent))

from aiworker.config.catalog import load_specs
from aiworker.schemas.pipeline_check import check_pipeline, parse_pipeline
from bench.crawl import (
    FIELDS,
    SITES,
    Site,
    _agreement,
    _pipeline,
    journal_html,
    median_run,
    page_html,
    temporal_ceiling,
)


def test_the_site_serves_robots_a_sitemap_of_every_page_and_pages_of_about_5_7_kb() -> None:
    site = Site(30)
    try:
        # one client, one connection: the server keeps it alive between requests
        with httpx.Client(base_url=site.base, timeout=10) as client:
            robots = client.get("/robots.txt")
            assert robots.status_code == 200
            assert f"Sitemap: {site.base}/sitemap.xml" in robots.text
            assert "Disallow" not in robots.text
            sitemap = client.get("/sitemap.xml").text
            locs = re.findall(r"<loc>([^<]+)</loc>", sitemap)
            assert locs == [f"{site.base}/p/{i}.html" for i in range(30)]
            page = client.get("/p/7.html")
            assert page.headers["content-type"].startswith("text/html")
            assert 5_500 <= len(page.content) <= 6_000
            soup = BeautifulSoup(page.text, "lxml")
            got = {k: soup.select_one(sel).get_text() for k, sel in FIELDS.items()}  # type: ignore[union-attr]
            assert got == {"title": "Product 7 Deluxe", "price": "259.99", "category": "Category 7"}
            assert client.get("/p/missing.html").status_code == 404
            assert client.head("/p/1.html").content == b""
    finally:
        site.stop()
    assert site.proc.poll() is not None  # stopped by its PID


def test_pages_differ_from_one_another() -> None:
    assert page_html(1) != page_html(2)
    assert journal_html(1) != journal_html(2)


def test_the_second_site_has_pages_of_another_shape_whose_three_fields_both_read() -> None:
    """The journal site: ~6 KB article pages, its fields where the shop has none."""
    fields = SITES["journal"].fields
    site = Site(12, "journal")
    try:
        with httpx.Client(base_url=site.base, timeout=10) as client:
            assert "Disallow" not in client.get("/robots.txt").text
            locs = re.findall(r"<loc>([^<]+)</loc>", client.get("/sitemap.xml").text)
            assert locs == [f"{site.base}/p/{i}.html" for i in range(12)]
            page = client.get("/p/7.html")
            assert 5_800 <= len(page.content) <= 6_600
            soup = BeautifulSoup(page.text, "lxml")
            got = {k: soup.select_one(sel).get_text() for k, sel in fields.items()}  # type: ignore[union-attr]
            assert got == {"title": "Field note 7", "price": "371.50", "category": "Topic 7"}
            # the shop's selectors find nothing here: another shape, not a copy
            assert all(soup.select_one(sel) is None for sel in FIELDS.values())
    finally:
        site.stop()
    assert site.proc.poll() is not None
    spec = _pipeline("http://127.0.0.1:9/sitemap.xml", 1, fields)
    specs = load_specs()
    assert check_pipeline(parse_pipeline(spec, specs), specs) == []


def test_the_bench_pipeline_passes_the_checks_aiworker_check_runs() -> None:
    specs = load_specs()
    spec = parse_pipeline(_pipeline("http://127.0.0.1:9/sitemap.xml"), specs)
    assert check_pipeline(spec, specs) == []
    pages = spec.steps[1]
    assert pages.max_parallel == 16


def test_agreement_counts_a_page_only_when_all_three_fields_match() -> None:
    rows = [{"url": f"u{i}", "title": f"T {i}", "price": "1.00", "category": "C"} for i in range(4)]
    same = [dict(r) for r in rows]
    same[0]["title"] = "T  0 "  # whitespace is not a difference
    assert _agreement(rows, same)["agreement"] == 1.0
    other = [dict(r) for r in rows]
    other[1]["price"] = "2.00"
    assert _agreement(rows, other) == {"pages_compared": 4, "pages_agreeing": 3, "agreement": 0.75}
    # a page one crawler never returned counts against agreement
    assert _agreement(rows, rows[:3])["agreement"] == 0.75


def test_a_repeated_variant_is_reported_by_its_median_run_whole() -> None:
    runs = [
        {"ratio_to_scrapy": r, "pages_per_s": 100 * r, "wall_seconds": 10 / r}
        for r in (1.11, 0.75, 0.96)
    ]
    chosen = median_run(runs)
    # the figures of one run (the median's), never a mix of several
    assert chosen == {**runs[2], "ratio_runs": [1.11, 0.75, 0.96]}
    assert "ratio_runs" not in runs[2]
    # an even count: the lower of the middle two
    assert median_run(runs[:2])["ratio_to_scrapy"] == 0.75
    # one run: as it was, with no list of one
    assert median_run(runs[:1]) == runs[0]


async def test_the_ceiling_runs_bare_temporal_activities_at_the_crawl_s_concurrency() -> None:
    """Temporal's own pace at one activity per page, on a dev server of its own: every
    activity ran (a chain per slot in flight), its CPU split between this process
    and the server. No timing asserted: the figure is the bench's to report."""
    got = await temporal_ceiling(24, concurrency=4)
    assert got["activities"] == 24 and got["concurrency"] == 4
    assert got["activities_per_s"] > 0
    assert got["cpu_s_per_activity"]["temporal_server"] > 0
    assert got["cpu_s_per_activity"]["worker_and_client"] > 0
