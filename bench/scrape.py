"""web-scrape pages/s: the full worker runtime against a direct httpx + bs4 loop.

Both paths fetch the same listing pages from the loopback fixture site and
extract the same fields (title, and per product name, price, link), in the
same run, in interleaved rounds so that noise on the shared machine hits both
alike. The worker path is ``WorkerRuntime.run`` with the real tools: envelope
and schema validation, spec compilation, egress policy, robots.txt (cached),
politeness slot, breaker, streamed body cap, charset handling, the artifact
written to disk, extraction and output validation. The direct path is what a
developer would write by hand: ``httpx.AsyncClient.get`` + ``BeautifulSoup``.
A third path, the worker with a store that hashes the page but writes no file
(``bench.common.UnwrittenPages``), gives ``ratio_without_page_write``: what
the one file per page that the step keeps costs, in the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
from bs4 import BeautifulSoup

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools.extract import PARSER
from aiworker.activities.web_scrape import WebScrape
from bench.common import interleaved, scrape_runtime, standalone, without_page_writes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fixtures.scrape_site import FixtureSite

SPEC = {
    "fields": {
        "title": {"selector": "h1", "required": True},
        "items": {
            "selector": ".product",
            "many": True,
            "fields": {
                "name": {"selector": ".name"},
                "price": {"selector": ".price", "type": "number"},
                "link": {"selector": "a", "attr": "href", "type": "url"},
            },
        },
    }
}
ITEMS_PER_PAGE = 30


async def _direct(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    resp = await client.get(url)
    resp.raise_for_status()
    soup = BeautifulSoup(resp.text, PARSER)
    h1 = soup.select_one("h1")
    items = []
    for el in soup.select(".product"):
        name, price, link = el.select_one(".name"), el.select_one(".price"), el.select_one("a")
        items.append(
            {
                "name": " ".join(name.get_text(" ").split()) if name else None,
                "price": float(price.get_text().split()[0].replace(",", "")) if price else None,
                "link": urljoin(url, str(link["href"])) if link else None,
            }
        )
    return {"title": h1.get_text(strip=True) if h1 else None, "items": items}


async def run(quick: bool = False) -> dict[str, Any]:
    pages = 150 if quick else 600
    site = FixtureSite().start()
    worker = WebScrape()
    seq = 0

    def next_page() -> None:
        nonlocal seq
        seq += 1  # distinct bytes per page, the same page for both paths

    def url() -> str:
        return site.url(f"/list?n={ITEMS_PER_PAGE}&p={seq}")

    try:
        async with (
            scrape_runtime("aiworker-bench-scrape-") as runtime,
            httpx.AsyncClient(timeout=30) as client,
        ):
            unwritten, unwritten_scrape = without_page_writes(runtime), WebScrape()

            async def via_worker(
                runtime: WorkerRuntime = runtime, worker: WebScrape = worker
            ) -> None:
                request = {
                    "worker_id": "web-scrape",
                    "idempotency_key": f"bench/{seq}",
                    "tenant": "bench",
                    "input": {"url": url(), "extraction_spec": SPEC},
                }
                # the call's telemetry, as the activity interceptor opens it in a worker process
                with observe_call(worker.worker_id, runtime.metrics):
                    resp = await runtime.run(worker, request)
                assert len(resp.outputs["data"]["items"]) == ITEMS_PER_PAGE

            async def direct() -> None:
                data = await _direct(client, url())
                assert len(data["items"]) == ITEMS_PER_PAGE

            async def unwritten_worker() -> None:
                await via_worker(unwritten, unwritten_scrape)

            paths = {"worker": via_worker, "direct": direct, "unwritten": unwritten_worker}
            # warm up both paths (connections, robots.txt, caches)
            await interleaved(20, paths, next_page)
            spent = await interleaved(pages, paths, next_page)
    finally:
        site.stop()
    n = pages
    worker_ps, direct_ps = n / spent["worker"], n / spent["direct"]
    ratio = worker_ps / direct_ps
    # the same worker path with the raw page hashed but not written to disk
    unwritten_ratio = (n / spent["unwritten"]) / direct_ps
    print(
        f"web-scrape: worker {worker_ps:.1f} pages/s, direct httpx+bs4 {direct_ps:.1f} pages/s, "
        f"ratio {ratio:.3f} (parser {PARSER}, {n} pages of {ITEMS_PER_PAGE} items each); "
        f"without writing the page {unwritten_ratio:.3f}"
    )
    return {
        "pages": n,
        "items_per_page": ITEMS_PER_PAGE,
        "parser": PARSER,
        "worker_pages_per_s": round(worker_ps, 2),
        "direct_pages_per_s": round(direct_ps, 2),
        "scrape_ratio_vs_direct": round(ratio, 3),
        "ratio": round(ratio, 3),
        "worker_unwritten_pages_per_s": round(n / spent["unwritten"], 2),
        "ratio_without_page_write": round(unwritten_ratio, 3),
        "command": command(quick),
    }


def command(quick: bool) -> str:
    """The command that reproduces these figures."""
    return f"{'BENCH_QUICK=1 ' if quick else ''}.venv/bin/python -m bench.scrape"


if __name__ == "__main__":
    standalone(run)
