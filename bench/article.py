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
Markdown output. A third path, the worker with a store that hashes the page
but writes no file, gives ``ratio_without_page_write`` (see ``bench/scrape.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import trafilatura

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools.content import ARTICLE_OPTIONS
from aiworker.activities.web_scrape import WebScrape
from bench.common import interleaved, scrape_runtime, standalone, without_page_writes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fixtures.article_site import FIRST, handle
from support.loopback import serve


async def run(quick: bool = False) -> dict[str, Any]:
    pages = 40 if quick else 200
    worker = WebScrape()
    seq = 0

    def next_page() -> None:
        nonlocal seq
        seq += 1  # a new page each round, the same page for both paths

    with serve(handle) as site:
        async with (
            scrape_runtime("aiworker-bench-article-") as runtime,
            httpx.AsyncClient(timeout=30) as client,
        ):
            unwritten, unwritten_scrape = without_page_writes(runtime), WebScrape()

            async def via_worker(
                runtime: WorkerRuntime = runtime, worker: WebScrape = worker
            ) -> None:
                request = {
                    "worker_id": "web-scrape",
                    "idempotency_key": f"bench-article/{seq}",
                    "tenant": "bench",
                    "input": {
                        "url": site.url(f"/news/{seq}"),
                        "extraction_spec": {"content": "article"},
                    },
                }
                with observe_call(worker.worker_id, runtime.metrics):
                    resp = await runtime.run(worker, request)
                assert FIRST in resp.outputs["data"]["content"]["markdown"]

            async def direct() -> None:
                page = await client.get(site.url(f"/news/{seq}"))
                page.raise_for_status()
                markdown = trafilatura.extract(
                    page.text, url=str(page.url), output_format="markdown", **ARTICLE_OPTIONS
                )
                assert markdown is not None and FIRST in markdown

            async def unwritten_worker() -> None:
                await via_worker(unwritten, unwritten_scrape)

            paths = {"worker": via_worker, "direct": direct, "unwritten": unwritten_worker}
            await interleaved(10, paths, next_page)  # warm-up: connections, robots.txt
            spent = await interleaved(pages, paths, next_page)
    worker_ps, direct_ps = pages / spent["worker"], pages / spent["direct"]
    ratio = worker_ps / direct_ps
    # the same worker path with the raw page hashed but not written to disk
    unwritten_ratio = (pages / spent["unwritten"]) / direct_ps
    print(
        f"article content: worker {worker_ps:.1f} pages/s, direct httpx+trafilatura "
        f"{direct_ps:.1f} pages/s, ratio {ratio:.3f} ({pages} pages); "
        f"without writing the page {unwritten_ratio:.3f}"
    )
    return {
        "pages": pages,
        "extractor": f"trafilatura {trafilatura.__version__}",
        "worker_pages_per_s": round(worker_ps, 2),
        "direct_pages_per_s": round(direct_ps, 2),
        "article_ratio_vs_direct": round(ratio, 3),
        "ratio": round(ratio, 3),
        "worker_unwritten_pages_per_s": round(pages / spent["unwritten"], 2),
        "ratio_without_page_write": round(unwritten_ratio, 3),
        "command": command(quick),
    }


def command(quick: bool) -> str:
    """The command that reproduces these figures."""
    return f"{'BENCH_QUICK=1 ' if quick else ''}.venv/bin/python -m bench.article"


if __name__ == "__main__":
    standalone(run)
