"""web-scrape pages/s: the full worker runtime against a direct httpx + bs4 loop.

Both paths fetch the same listing pages from the loopback fixture site and
extract the same fields (title, and per product name, price, link), in the
same run, in interleaved rounds so that noise on the shared machine hits both
alike. The worker path is ``WorkerRuntime.run`` with the real tools: envelope
and schema validation, spec compilation, egress policy, robots.txt (cached),
politeness slot, breaker, streamed body cap, charset handling, the artifact
written to disk, extraction and output validation. The direct path is what a
developer would write by hand: ``httpx.AsyncClient.get`` + ``BeautifulSoup``.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
from bs4 import BeautifulSoup
from prometheus_client import CollectorRegistry

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import scrape_tools
from aiworker.activities.tools.extract import PARSER
from aiworker.activities.web_scrape import WebScrape
from aiworker.schemas.catalog import load_specs
from aiworker.schemas.settings import Settings

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
    logging.getLogger("aiworker.worker").addHandler(logging.NullHandler())
    logging.getLogger("aiworker.worker").propagate = False
    site = FixtureSite().start()
    with tempfile.TemporaryDirectory(prefix="aiworker-bench-scrape-") as tmp:
        settings = Settings(data_dir=Path(tmp), metrics_port=0, allow_private_networks=True)
        tools = scrape_tools(settings)
        runtime = WorkerRuntime(
            settings, load_specs(), tools=tools, metrics=WorkerMetrics(CollectorRegistry())
        )
        worker = WebScrape()
        client = httpx.AsyncClient(timeout=30)
        seq = 0

        def url() -> str:
            nonlocal seq
            seq += 1
            return site.url(f"/list?n={ITEMS_PER_PAGE}&p={seq}")

        async def via_worker() -> None:
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

        try:
            for _ in range(20):  # warm up both paths (connections, robots.txt, caches)
                await via_worker()
                await direct()
            # Interleaved page by page, so load from other processes on this shared
            # machine hits both paths alike.
            spent = {"worker": 0.0, "direct": 0.0}
            for i in range(pages):
                order = (("direct", direct), ("worker", via_worker))
                for name, fn in order if i % 2 else order[::-1]:
                    t0 = time.perf_counter()
                    await fn()
                    spent[name] += time.perf_counter() - t0
        finally:
            await client.aclose()
            await tools["fetch_url"].aclose()
            site.stop()
    n = pages
    worker_ps, direct_ps = n / spent["worker"], n / spent["direct"]
    ratio = worker_ps / direct_ps
    print(
        f"web-scrape: worker {worker_ps:.1f} pages/s, direct httpx+bs4 {direct_ps:.1f} pages/s, "
        f"ratio {ratio:.3f} (parser {PARSER}, {n} pages of {ITEMS_PER_PAGE} items each)"
    )
    return {
        "pages": n,
        "items_per_page": ITEMS_PER_PAGE,
        "parser": PARSER,
        "worker_pages_per_s": round(worker_ps, 2),
        "direct_pages_per_s": round(direct_ps, 2),
        "scrape_ratio_vs_direct": round(ratio, 3),
    }


if __name__ == "__main__":
    import asyncio

    asyncio.run(run(quick="--quick" in sys.argv))
