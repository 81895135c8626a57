"""Article-mode pages/s: the web-scrape worker's content path against trafilatura called directly.

Both paths fetch the same generated news pages (``tests/fixtures/article_site.py``:
navigation, ads, comments and a footer around a body with a heading, a list,
a link and a table; each page's prose differs) from a loopback server, in the
same run, interleaved page by page so that noise on the shared machine hits
both alike. The worker path is ``WorkerRuntime.run`` with
``extraction_spec: {"content": "article"}`` and the real tools (schema
validation, egress policy, robots.txt, politeness, body cap, artifact on
disk, the extraction in the content thread pool, Markdown and text
renderings, output validation). The direct path is what a developer would
write: ``httpx`` GET, then ``trafilatura.extract`` with the same options and
Markdown output.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trafilatura
from prometheus_client import CollectorRegistry

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import scrape_tools
from aiworker.activities.tools.content import ARTICLE_OPTIONS
from aiworker.activities.web_scrape import WebScrape
from aiworker.schemas.catalog import load_specs
from aiworker.schemas.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fixtures.article_site import FIRST, ArticleSite


async def run(quick: bool = False) -> dict[str, Any]:
    pages = 40 if quick else 200
    logging.getLogger("aiworker.worker").addHandler(logging.NullHandler())
    logging.getLogger("aiworker.worker").propagate = False
    site = ArticleSite().start()
    with tempfile.TemporaryDirectory(prefix="aiworker-bench-article-") as tmp:
        settings = Settings(data_dir=Path(tmp), metrics_port=0, allow_private_networks=True)
        tools = scrape_tools(settings)
        runtime = WorkerRuntime(
            settings, load_specs(), tools=tools, metrics=WorkerMetrics(CollectorRegistry())
        )
        worker = WebScrape()
        client = httpx.AsyncClient(timeout=30)
        seq = 0

        def url() -> str:
            return site.url(f"/news/{seq}")

        async def via_worker() -> None:
            request = {
                "worker_id": "web-scrape",
                "idempotency_key": f"bench-article/{seq}",
                "tenant": "bench",
                "input": {"url": url(), "extraction_spec": {"content": "article"}},
            }
            with observe_call(worker.worker_id, runtime.metrics):
                resp = await runtime.run(worker, request)
            assert FIRST in resp.outputs["data"]["content"]["markdown"]

        async def direct() -> None:
            page = await client.get(url())
            page.raise_for_status()
            markdown = trafilatura.extract(
                page.text, url=str(page.url), output_format="markdown", **ARTICLE_OPTIONS
            )
            assert markdown is not None and FIRST in markdown

        try:
            for _ in range(10):  # warm up both paths (connections, robots.txt, imports)
                seq += 1
                await via_worker()
                await direct()
            spent = {"worker": 0.0, "direct": 0.0}
            for i in range(pages):
                seq += 1  # a new page each round, the same page for both paths
                order = (("direct", direct), ("worker", via_worker))
                for name, fn in order if i % 2 else order[::-1]:
                    t0 = time.perf_counter()
                    await fn()
                    spent[name] += time.perf_counter() - t0
        finally:
            await client.aclose()
            await tools["fetch_url"].aclose()
            site.stop()
    worker_ps, direct_ps = pages / spent["worker"], pages / spent["direct"]
    ratio = worker_ps / direct_ps
    print(
        f"article content: worker {worker_ps:.1f} pages/s, direct httpx+trafilatura "
        f"{direct_ps:.1f} pages/s, ratio {ratio:.3f} ({pages} pages)"
    )
    return {
        "pages": pages,
        "extractor": f"trafilatura {trafilatura.__version__}",
        "worker_pages_per_s": round(worker_ps, 2),
        "direct_pages_per_s": round(direct_ps, 2),
        "article_ratio_vs_direct": round(ratio, 3),
    }


if __name__ == "__main__":
    import asyncio

    asyncio.run(run(quick="--quick" in sys.argv))
