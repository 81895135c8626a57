"""A crawl against Scrapy: one generated loopback site, crawled by both, same run.

The site (``N`` product pages of ~5.7 KB, ``/sitemap.xml`` listing them all,
``robots.txt`` allowing everything and naming the sitemap) is served from
memory by a small asyncio HTTP/1.1 server with keep-alive in a process of its
own, so it is never the bottleneck (thousands of requests per second on one
core; both crawlers need a few hundred).

- **Scrapy** (bench-only dependency, ``pip install -e '.[bench]'``): a
  ``SitemapSpider`` starting at robots.txt, three fields by CSS selector,
  ``CONCURRENT_REQUESTS=16``, no delay, robots obeyed, AutoThrottle off, in a
  process of its own, before and after every aiworker run (each aiworker run's
  ratio is against the mean of the two beside it: the shared machine's load
  drifts over minutes). Its time is Scrapy's own ``elapsed_time_seconds`` stat
  (spider open to close), its CPU the process's CPU over the same span.
- **aiworker**: ``aiworker dev --headless --no-model`` as shipped (a process that
  is the worker, with the Temporal server as its child), then one pipeline:
  ``discover`` from the sitemap and a ``for_each`` web-scrape of every URL with
  ``max_parallel: 16``, ``cache: "off"``, the same three fields. No politeness
  delay: ``AIWORKER_AUTOTHROTTLE=false`` (the floor is 0 by default). The
  web-scrape spec's seeded rate limit (10/min) is lifted with
  ``AIWORKER_RATE_LIMITS='web-scrape:*=100000/min'``, so every page still asks
  the limiter for a permit (``limiter: "on"``). The ``limiter: "off"`` variant
  runs the same stack with the worker's rate limit taken away (``rate_limit_for``
  answers no limit, patched in that dev process only): what the crawl costs past
  the limiter. Its time runs from the pipeline's start to its result (the
  worker is warm: a 20-page crawl ran first); its CPU is the dev process's plus
  the Temporal server's over that span.

- **Temporal's ceiling** (``temporal_ceiling``, once per run, after the sites):
  bare Temporal running one no-op regular activity per page at the same
  concurrency on a dev server started the same way. A crawl of one item per
  activity task cannot pass it on this machine, whatever a page costs:
  ``temporal_ceiling.ratio_to_scrapy`` says how near Scrapy's pace that ceiling
  is, ``one_item_per_task_of_ceiling`` (per site) how much of it aiworker reaches.

Reported: pages/s and its ratio to Scrapy's (top-level ``ratio``: the shipped
configuration, limiter on), CPU-seconds per page, peak RSS of the worker
process and of the Temporal server, bytes written per page (growth of the data
directory's artifacts, lineage, payloads, cache and Temporal database, and the
processes' ``write_bytes`` from ``/proc``), history bytes and events per page
(every workflow of the run), and field agreement page by page (must be 1.0).

``BENCH_QUICK=1 python -m bench.crawl`` (2,000 pages) or ``python -m bench.crawl``
(10,000). ``BENCH_CRAWL_VARIANTS=off`` runs only the limiter-off variant,
``on`` only the shipped one (default ``on+tasks100,off+tasks100,on+tasks16,on``); a variant may add
flags of ``aiworker dev`` after ``+`` (``off+fast-poll`` runs ``aiworker dev
--fast-poll``), and ``+tasksN`` sets the step's ``items_per_task`` to N (key
``aiworker_limiter_on+items_per_task_N``). ``BENCH_CRAWL_REPEATS`` runs the
variants in turn that many times (default 3 for a quick crawl, 1 for 10,000
pages), each aiworker run between two Scrapy runs: a variant's figures are
those of its median run, ``ratio_runs`` every run's ratio. The headline ``ratio`` is the first
limiter-on variant with ``items_per_task`` (the recommended crawl,
docs/scrape-discovery.md), else the first variant.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import embedded_server, process_cpu_seconds, standalone
from bench.foreach import _PeakRss, _rss_mb

QUICK_PAGES = 2_000
# A quick crawl of 2,000 pages lasts seconds, and one pair of it swings from 0.66 to
# 1.17 of Scrapy between runs minutes apart on the 2-core bench machine (the CPU
# per page of both crawlers moves as much): each variant runs three times, in
# turn with the others, and is reported by its median run.
QUICK_REPEATS = 3
# The recommended items_per_task for a crawl (docs/scrape-discovery.md), the headline:
# a whole chunk (the default chunk_size, 100) to one task, whose pages keep
# max_parallel in flight as each ends. 16 (one task of 16 pages at a time, the
# recommendation before) stays as a variant to compare with.
ITEMS_PER_TASK = 100
DEFAULT_VARIANTS = f"on+tasks{ITEMS_PER_TASK},off+tasks{ITEMS_PER_TASK},on+tasks16,on"
# every site after the first: the headline and one item per task
OTHER_SITE_VARIANTS = f"on+tasks{ITEMS_PER_TASK},on"
FULL_PAGES = 10_000
CONCURRENCY = 16
WARMUP_PAGES = 20
FIELDS = {"title": "h1.title", "price": "span.price", "category": "p.category > a"}
_WORDS = (
    "durable orchestration sitemap crawler product catalog shipping warranty review "
    "stock colour material weight dimension battery charger cable adapter premium"
).split()


# ---------------------------------------------------------------- the site


def page_html(i: int) -> bytes:
    """Page ``i`` of the generated shop: the three fields and ~5.5 KB of filler."""
    paras = []
    for p in range(10):
        words = [_WORDS[(i * 7 + p * 3 + k) % len(_WORDS)] for k in range(58)]
        paras.append(f"<p class='text'>{' '.join(words)}.</p>")
    related = "".join(
        f"<li><a href='/p/{(i + k) % 997}.html'>Related {k}</a></li>" for k in range(1, 9)
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Product {i}</title></head><body>"
        "<nav><a href='/'>Home</a> / <a href='/c/'>Catalog</a></nav>"
        f"<main><h1 class='title'>Product {i} Deluxe</h1>"
        f"<div class='buy'><span class='price'>{(i * 37) % 1000 + 0.99:.2f}</span>"
        " <span class='currency'>EUR</span></div>"
        f"<p class='category'>In <a href='/c/{i % 23}/'>Category {i % 23}</a></p>"
        f"{''.join(paras)}<ul class='related'>{related}</ul></main>"
        "<footer>Generated for bench.crawl</footer></body></html>"
    ).encode()


JOURNAL_FIELDS = {
    "title": "h2.headline",
    "price": "dl.facts dd.price",
    "category": "span.byline a[rel=tag]",
}


def journal_html(i: int) -> bytes:
    """Page ``i`` of the second site, of another shape: an article of ~6 KB (a head
    with inline style and JSON-LD, nested wrappers, twelve paragraphs of filler
    with inline markup, a side list of links), its three fields in a header, a
    definition list and a byline."""
    paras = []
    for p in range(12):
        words = [_WORDS[(i * 5 + p * 11 + k) % len(_WORDS)] for k in range(44)]
        words[7] = f"<em>{words[7]}</em>"
        words[21] = f"<a href='/j/{(i + p) % 991}.html'>{words[21]}</a>"
        paras.append(f"<p>{' '.join(words)}.</p>")
    side = "".join(
        f"<li><a href='/j/{(i * 3 + k) % 991}.html'>Note {k}</a></li>" for k in range(12)
    )
    topic = f"Topic {i % 17}"
    ld = json.dumps({"@context": "https://schema.org", "@type": "Article", "headline": f"Note {i}"})
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Journal {i}</title>"
        "<style>body{font:16px/1.5 serif;margin:0}.wrap{max-width:42em;margin:auto}"
        "dl.facts{display:grid;grid-template-columns:auto 1fr}aside{font-size:.9em}</style>"
        f"<script type='application/ld+json'>{ld}</script></head><body>"
        "<div class='wrap'><div class='col'><article class='entry'>"
        f"<header><h2 class='headline'>Field note {i}</h2>"
        f"<span class='byline'>Filed under <a rel='tag' href='/t/{i % 17}/'>{topic}</a>"
        f" by <a rel='author' href='/a/{i % 5}/'>Author {i % 5}</a></span></header>"
        "<dl class='facts'><dt>Edition</dt><dd class='edition'>"
        f"{2000 + i % 25}</dd><dt>Price</dt><dd class='price'>{(i * 53) % 900 + 0.5:.2f}"
        f"</dd></dl><section class='body'>{''.join(paras)}</section></article>"
        f"<aside><h3>More notes</h3><ul>{side}</ul></aside></div></div>"
        "<footer><p>Generated for bench.crawl, second site</p></footer></body></html>"
    ).encode()


@dataclass(frozen=True)
class SiteShape:
    """A generated site: what it is, its page ``i`` and the CSS selectors of its
    three fields (both crawlers extract the same)."""

    about: str
    page: Callable[[int], bytes]
    fields: dict[str, str]


SITES = {
    "shop": SiteShape("product pages of ~5.7 KB (the bench's own site)", page_html, FIELDS),
    "journal": SiteShape(
        "article pages of ~6 KB of another shape: nested wrappers, inline markup in "
        "the filler, fields in a header, a definition list and a byline",
        journal_html,
        JOURNAL_FIELDS,
    ),
}
"""The sites a crawl runs on: ``shop`` first (the headline), then ``journal``."""


def _site(base: str, n: int, shape: str = "shop") -> dict[bytes, tuple[bytes, bytes]]:
    pages: dict[bytes, tuple[bytes, bytes]] = {}
    for i in range(n):
        pages[f"/p/{i}.html".encode()] = (b"text/html; charset=utf-8", SITES[shape].page(i))
    locs = "".join(f"<url><loc>{base}/p/{i}.html</loc></url>" for i in range(n))
    sitemap = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'
    )
    pages[b"/sitemap.xml"] = (b"application/xml", sitemap.encode())
    # a warm-up sitemap of the first pages (the worker's first crawl)
    warm = "".join(f"<url><loc>{base}/p/{i}.html</loc></url>" for i in range(WARMUP_PAGES))
    pages[b"/warmup.xml"] = (
        b"application/xml",
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{warm}</urlset>'.encode(),
    )
    robots = f"User-agent: *\nAllow: /\nSitemap: {base}/sitemap.xml\n"
    pages[b"/robots.txt"] = (b"text/plain", robots.encode())
    return pages


def _response(status: bytes, ctype: bytes, body: bytes, head_only: bool) -> bytes:
    head = (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype
        + b"\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\nConnection: keep-alive\r\n\r\n"
    )  # fmt: skip
    return head if head_only else head + body


async def _serve(port: int, n: int, shape: str) -> None:
    base = f"http://127.0.0.1:{port}"
    site = _site(base, n, shape)
    get = {k: _response(b"200 OK", ct, body, False) for k, (ct, body) in site.items()}
    head = {k: _response(b"200 OK", ct, body, True) for k, (ct, body) in site.items()}
    missing = _response(b"404 Not Found", b"text/plain", b"not found", False)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await reader.readuntil(b"\r\n\r\n")
                method, target = req.split(b" ", 2)[:2]
                path = target.split(b"?", 1)[0]
                if path.startswith(b"http"):  # absolute-form
                    path = b"/" + path.split(b"/", 3)[3] if path.count(b"/") >= 3 else b"/"
                table = head if method == b"HEAD" else get
                writer.write(table.get(path, missing))
                await writer.drain()
                if b"connection: close" in req.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class Site:
    """The site's server process (started and stopped by its PID)."""

    def __init__(self, n: int, shape: str = "shop") -> None:
        from aiworker.workers.devstack.devserver import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.crawl", "serve", str(self.port), str(n), shape],
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError("the bench site did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------- Scrapy


def _scrapy_main(base: str, out: str, shape: str) -> None:
    """In its own process: crawl the site with Scrapy, write items and figures to ``out``."""
    import resource

    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.spiders import SitemapSpider

    items: list[dict[str, Any]] = []
    cpu: dict[str, float] = {}

    class BenchSpider(SitemapSpider):  # type: ignore[misc]
        name = "bench"
        sitemap_urls = [f"{base}/robots.txt"]

        def parse(self, response: Any) -> Any:
            row = {"url": response.url}
            for key, sel in SITES[shape].fields.items():
                row[key] = response.css(f"{sel}::text").get()
            yield row

    process = CrawlerProcess(
        settings={
            "CONCURRENT_REQUESTS": CONCURRENCY,
            "DOWNLOAD_DELAY": 0,
            "ROBOTSTXT_OBEY": True,
            "AUTOTHROTTLE_ENABLED": False,
            "LOG_LEVEL": os.environ.get("BENCH_SCRAPY_LOG", "WARNING"),
            "TELNETCONSOLE_ENABLED": False,
        }
    )
    crawler = process.create_crawler(BenchSpider)

    def opened(spider: Any) -> None:
        cpu["open"] = time.process_time()

    def closed(spider: Any) -> None:
        cpu["close"] = time.process_time()

    def scraped(item: Any) -> None:
        items.append(dict(item))

    # named functions that outlive the crawl: Scrapy holds signal receivers weakly
    crawler.signals.connect(scraped, signals.item_scraped)
    crawler.signals.connect(opened, signals.spider_opened)
    crawler.signals.connect(closed, signals.spider_closed)
    process.crawl(crawler)
    process.start()
    stats = crawler.stats.get_stats()
    Path(out).write_text(
        json.dumps(
            {
                "items": items,
                "elapsed": stats["elapsed_time_seconds"],
                "cpu": cpu["close"] - cpu["open"],
                "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_scrapy(base: str, shape: str = "shop") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scrapy-") as tmp:
        out = Path(tmp) / "out.json"
        subprocess.run(
            [sys.executable, "-m", "bench.crawl", "scrapy", base, str(out), shape],
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        return dict(json.loads(out.read_text()))


# ---------------------------------------------------------------- aiworker

_NO_LIMIT = (
    "import aiworker.activities.limits as m; m.rate_limit_for = lambda *a, **k: None; "
    "from aiworker.workers.cli.main import run_main; run_main()"
)


def _pipeline(sitemap: str, per_task: int = 1, fields: dict[str, str] = FIELDS) -> dict[str, Any]:
    # BENCH_CRAWL_CHUNK_SIZE: a diagnostic (the default is 100)
    chunk = os.environ.get("BENCH_CRAWL_CHUNK_SIZE")
    return {
        "name": "bench-crawl",
        "tenant": "bench",
        "inputs": {"url": sitemap},
        "steps": [
            {
                "id": "find",
                "worker": "web-scrape",
                "input": {
                    "url": "${{ inputs.url }}",
                    "discover": {"sitemap": "${{ inputs.url }}", "max_urls": 10_000},
                },
            },
            {
                "id": "pages",
                "worker": "web-scrape",
                "depends_on": ["find"],
                "for_each": "${{ steps.find.outputs.data.urls }}",
                # BENCH_CRAWL_PARALLEL: a diagnostic (Scrapy keeps 16)
                "max_parallel": int(os.environ.get("BENCH_CRAWL_PARALLEL") or CONCURRENCY),
                **({"chunk_size": int(chunk)} if chunk else {}),
                **({"items_per_task": per_task} if per_task > 1 else {}),
                "input": {
                    "url": "${{ item }}",
                    "cache": "off",
                    "extraction_spec": {"fields": {k: {"selector": v} for k, v in fields.items()}},
                },
            },
        ],
        "output": {
            "urls": "${{ steps.find.outputs.data.urls }}",
            "succeeded": "${{ steps.pages.outputs.succeeded }}",
        },
    }


def _dir_bytes(root: Path) -> dict[str, int]:
    """Bytes under each part of the data directory that a crawl writes to."""
    parts = {"artifacts": 0, "lineage": 0, "payloads": 0, "cache": 0, "temporal_db": 0, "logs": 0}
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(root).parts
        size = p.stat().st_size
        if rel[0] in parts:
            parts[rel[0]] += size
        elif rel[0].startswith("temporal.db"):
            parts["temporal_db"] += size
        elif rel[0].endswith(".log"):
            parts["logs"] += size
    return parts


def _write_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the worker (``BENCH_CRAWL_PROFILE=1``; the dev extra), or None."""
    if os.environ.get("BENCH_CRAWL_PROFILE", "") in ("", "0"):
        return None
    from bench.profile import _py_spy

    argv = [_py_spy(), "record", "--pid", str(pid), "--format", "raw", "--full-filenames"]
    argv += ["--nolineno", "--gil", "-r", "100", "-o", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the crawl starts
    return spy


def _spy_summary(spy: subprocess.Popen[bytes] | None, out: Path) -> dict[str, Any] | None:
    if spy is None:
        return None
    from bench.profile import summarize

    spy.send_signal(2)  # SIGINT: py-spy writes its samples and exits
    spy.wait(timeout=60)
    summary = summarize(out.read_text()) if out.exists() else {"error": "no samples"}
    keep = os.environ.get("BENCH_CRAWL_PROFILE", "")
    if keep not in ("", "1") and out.exists():  # a path: keep the raw samples there
        Path(keep).write_text(out.read_text())
    summary.pop("module_bodies_inclusive", None)
    return summary


def _latencies(h: Any, acc: dict[str, list[float]]) -> None:
    """Per activity: scheduled to started (``queued``: dispatch through matching) and
    started to completed (``running``); per workflow task, scheduled to started."""
    from temporalio.api.enums.v1 import EventType

    def t(e: Any) -> float:
        return float(e.event_time.ToNanoseconds()) / 1e9

    by_id = {e.event_id: e for e in h.events}
    for e in h.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sched = by_id[e.activity_task_started_event_attributes.scheduled_event_id]
            acc["queued"].append(t(e) - t(sched))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            started = by_id[e.activity_task_completed_event_attributes.started_event_id]
            acc["running"].append(t(e) - t(started))
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            sched = by_id[e.workflow_task_started_event_attributes.scheduled_event_id]
            acc["wft_queued"].append(t(e) - t(sched))


def _server_pid(data_dir: Path) -> int:
    for line in (data_dir / "dev.lock").read_text().splitlines():
        if line.startswith("server pid "):
            return int(line.split()[2])
    raise RuntimeError("dev.lock names no server pid")


async def run_aiworker(
    base: str,
    n: int,
    limiter: bool,
    flags: list[str],
    per_task: int = 1,
    fields: dict[str, str] = FIELDS,
) -> dict[str, Any]:
    from aiworker.config.settings import Settings
    from aiworker.schemas import names
    from aiworker.workers.client.client import PipelineClient
    from aiworker.workers.client.temporal_client import connect
    from aiworker.workers.devstack.devserver import free_port
    from bench.counts import count_history, run_histories

    with tempfile.TemporaryDirectory(prefix="bench-crawl-") as tmp:
        data = Path(tmp)
        port = free_port()
        env = {
            **os.environ,
            "AIWORKER_DATA_DIR": tmp,
            "AIWORKER_METRICS_PORT": "0",
            "AIWORKER_AUTOTHROTTLE": "false",
            "AIWORKER_RATE_LIMITS": "web-scrape:*=100000/min",
        }
        dev_args = ["dev", "--headless", "--no-model", "--port", str(port), "--data-dir", tmp]
        dev_args += flags
        head = ["-m", "aiworker.workers.cli.main"] if limiter else ["-c", _NO_LIMIT]
        proc = subprocess.Popen(
            [sys.executable, *head, *dev_args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            settings = Settings(data_dir=data, metrics_port=0)
            client = await connect(
                target_host=f"127.0.0.1:{port}", settings=settings, wait_seconds=60
            )
            pipelines = PipelineClient(client, settings)
            queue = settings.queue(names.PIPELINES_QUEUE)

            async def crawl(sitemap: str, wid: str) -> dict[str, Any]:
                result: dict[str, Any] = await client.execute_workflow(
                    names.PIPELINE_WORKFLOW,
                    _pipeline(sitemap, per_task, fields),
                    id=wid,
                    task_queue=queue,
                )
                return result

            # warm up (the worker polls, the sandbox has imported the workflows)
            await crawl(f"{base}/warmup.xml", f"bench-crawl-warm-{uuid.uuid4().hex[:6]}")
            server_pid = _server_pid(data)
            pids = (proc.pid, server_pid)
            disk0, io0 = _dir_bytes(data), [_write_bytes(p) for p in pids]
            cpu0 = [process_cpu_seconds(p) for p in pids]
            wid = f"bench-crawl-{uuid.uuid4().hex[:8]}"
            spy = _spy(proc.pid, data / "py-spy.txt")
            with _PeakRss(proc.pid) as worker_rss, _PeakRss(server_pid) as server_rss:
                t0 = time.perf_counter()
                result = await crawl(f"{base}/sitemap.xml", wid)
                wall = time.perf_counter() - t0
            profile = _spy_summary(spy, data / "py-spy.txt")
            cpu1 = [process_cpu_seconds(p) for p in pids]
            io1 = [_write_bytes(p) for p in pids]
            # let the server flush what it buffered before sizing its database
            disk1 = _dir_bytes(data)
            if result["status"] not in ("succeeded",) or result["output"]["succeeded"] != n:
                got = result["output"].get("succeeded")
                raise RuntimeError(f"crawl: {result['status']}, {got} of {n} pages")
            outputs = await pipelines.items(wid, "pages")
            items = [
                {"url": u, **{k: (o or {}).get("data", {}).get(k) for k in fields}}
                for u, o in zip(result["output"]["urls"], outputs, strict=True)
            ]
            hist = {"history_bytes": 0, "events": 0, "workflows": 0, "largest": 0}
            by_event: dict[str, int] = {}
            spans: dict[str, tuple[float, float]] = {}
            lat: dict[str, list[float]] = {"queued": [], "running": [], "wft_queued": []}
            async for h in run_histories(client, wid):
                c = count_history(h)
                hist["history_bytes"] += c["history_bytes"]
                hist["events"] += c["events"]
                hist["workflows"] += 1
                hist["largest"] = max(hist["largest"], c["history_bytes"])
                _latencies(h, lat)
                first, last = h.events[0].event_time, h.events[-1].event_time
                spans[h.workflow_id] = (first.ToNanoseconds() / 1e9, last.ToNanoseconds() / 1e9)
                for ev, b in c["payload_bytes_by_event"].items():
                    by_event[ev] = by_event.get(ev, 0) + b
            idle_rss = _rss_mb(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    grown = {k: disk1[k] - disk0[k] for k in disk0}
    # where the pipeline's time went: inside chunk workflows, or between them
    chunks = sorted(v for k, v in spans.items() if k != wid)
    busy, edge = 0.0, 0.0
    for a, b in chunks:
        busy += max(0.0, b - max(a, edge))
        edge = max(edge, b)
    timeline = {
        "pipeline_s": round(spans[wid][1] - spans[wid][0], 2),
        "in_chunks_s": round(busy, 2),
        "before_first_chunk_s": round(chunks[0][0] - spans[wid][0], 2) if chunks else None,
        "chunks": len(chunks),
    }
    return {
        "limiter": "on" if limiter else "off",
        "dev_flags": " ".join(flags),
        "items_per_task": per_task,
        "pages": n,
        "wall_seconds": round(wall, 2),
        "pages_per_s": round(n / wall, 2),
        "cpu_s_per_page": {
            "worker": round((cpu1[0] - cpu0[0]) / n, 5),
            "temporal_server": round((cpu1[1] - cpu0[1]) / n, 5),
            "total": round((cpu1[0] + cpu1[1] - cpu0[0] - cpu0[1]) / n, 5),
        },
        "peak_rss_mb": {
            "worker": round(worker_rss.peak, 1),
            "temporal_server": round(server_rss.peak, 1),
            "worker_after": round(idle_rss, 1),
        },
        "disk_bytes_per_page": {k: round(v / n) for k, v in grown.items()}
        | {"total": round(sum(grown.values()) / n)},
        "write_bytes_per_page": {
            "worker": round((io1[0] - io0[0]) / n),
            "temporal_server": round((io1[1] - io0[1]) / n),
        },
        "history_per_page": {
            "bytes": round(hist["history_bytes"] / n),
            "events": round(hist["events"] / n, 2),
            "workflows": hist["workflows"],
            "largest_history_bytes": hist["largest"],
            "payload_bytes_by_event": {
                k: round(v / n) for k, v in sorted(by_event.items(), key=lambda kv: -kv[1])
            },
        },
        "timeline": timeline
        | {f"{k}_ms_p50": round(statistics.median(v) * 1000, 1) for k, v in lat.items() if v},
        "_items": items,
    } | ({"profile": profile} if profile else {})


def _agreement(
    a: list[dict[str, Any]], b: list[dict[str, Any]], fields: dict[str, str] = FIELDS
) -> dict[str, Any]:
    """Share of pages whose three fields are equal in both crawls (by URL)."""

    def norm(v: Any) -> Any:
        return " ".join(v.split()) if isinstance(v, str) else v

    by_url = {r["url"]: r for r in b}
    same = sum(
        1
        for r in a
        if r["url"] in by_url and all(norm(r[k]) == norm(by_url[r["url"]][k]) for k in fields)
    )
    return {
        "pages_compared": len(a),
        "pages_agreeing": same,
        "agreement": round(same / max(1, max(len(a), len(b))), 4),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    """The crawl of each site of ``BENCH_CRAWL_SITES`` (default ``shop,journal``):
    the first site's figures at the top level (the headline), every other under
    ``sites.<name>``, each with Scrapy beside it on the same site."""
    if importlib.util.find_spec("scrapy") is None:
        # the baseline is missing, so there is no ratio to report
        return {"skipped": "Scrapy is not installed: pip install -e '.[bench]' (make bench does)"}
    n = int(os.environ.get("BENCH_CRAWL_PAGES") or (QUICK_PAGES if quick else FULL_PAGES))
    sites = os.environ.get("BENCH_CRAWL_SITES", ",".join(SITES)).split(",")
    unknown = [x for x in sites if x not in SITES]
    if unknown:
        raise SystemExit(f"BENCH_CRAWL_SITES: unknown {unknown}; known: {', '.join(SITES)}")
    repeats = int(os.environ.get("BENCH_CRAWL_REPEATS") or (QUICK_REPEATS if quick else 1))
    out: dict[str, Any] = {}
    for i, shape in enumerate(sites):
        # the first site runs every variant; the others the headline and one item a task
        default = DEFAULT_VARIANTS if i == 0 else OTHER_SITE_VARIANTS
        variants = os.environ.get("BENCH_CRAWL_VARIANTS", default).split(",")
        figures = await crawl_site(shape, n, variants, repeats)
        if i == 0:
            out.update(figures)
        else:
            out.setdefault("sites", {})[shape] = figures
    if os.environ.get("BENCH_CRAWL_CEILING", "1") != "0":
        ceiling = await temporal_ceiling(n)
        ceiling["ratio_to_scrapy"] = round(
            ceiling["activities_per_s"] / out["scrapy"]["pages_per_s"], 3
        )
        out["temporal_ceiling"] = ceiling
        for figures in (out, *out.get("sites", {}).values()):
            one = figures.get("aiworker_limiter_on")
            if one is not None:
                share = one["pages_per_s"] / ceiling["activities_per_s"]
                figures["one_item_per_task_of_ceiling"] = round(share, 3)
    out["command"] = ("BENCH_QUICK=1 " if quick else "") + ".venv/bin/python -m bench.crawl"
    return out


async def temporal_ceiling(n: int, concurrency: int = CONCURRENCY) -> dict[str, Any]:
    """Bare Temporal's own pace at one regular activity per page: ``n`` no-op
    activities, ``concurrency`` in flight (``concurrency`` bare workflows of a
    chain each, the sandbox on as Temporal's default), on a dev server started
    as ``aiworker dev`` starts it, worker and client in this process. The most a
    crawl of one activity task per page can reach on this machine, whatever its
    pages cost; ``ratio_to_scrapy`` sets it against Scrapy's pace (``BENCH_CRAWL_CEILING=0``
    leaves it out)."""
    from temporalio.client import Client
    from temporalio.worker import Worker

    from bench.bare_workflow import BareBenchWorkflow, noop

    per = max(1, n // concurrency)
    with embedded_server() as server:
        client = await Client.connect(server.address)
        queue = f"bench-ceiling-{uuid.uuid4().hex[:6]}"
        async with Worker(
            client, task_queue=queue, workflows=[BareBenchWorkflow], activities=[noop]
        ):

            async def chain(length: int) -> None:
                await client.execute_workflow(
                    BareBenchWorkflow.run,
                    {"kind": "chain", "n": length},
                    id=f"bench-ceiling-{uuid.uuid4().hex}",
                    task_queue=queue,
                )

            await chain(WARMUP_PAGES)
            pid = server.process.pid if server.process else None
            cpu0 = (time.process_time(), process_cpu_seconds(pid) if pid else 0.0)
            t0 = time.perf_counter()
            await asyncio.gather(*(chain(per) for _ in range(concurrency)))
            wall = time.perf_counter() - t0
            cpu1 = (time.process_time(), process_cpu_seconds(pid) if pid else 0.0)
    done = per * concurrency
    return {
        "about": "bare Temporal, one no-op regular activity per page at the crawl's "
        "concurrency: the ceiling of one item per activity task on this machine",
        "activities": done,
        "concurrency": concurrency,
        "activities_per_s": round(done / wall, 2),
        "cpu_s_per_activity": {
            "worker_and_client": round((cpu1[0] - cpu0[0]) / done, 5),
            "temporal_server": round((cpu1[1] - cpu0[1]) / done, 5),
        },
    }


async def crawl_site(shape: str, n: int, variants: list[str], repeats: int = 1) -> dict[str, Any]:
    """Every variant's crawl of the ``shape`` site against Scrapy's beside it,
    the variants in turn ``repeats`` times, each variant reported by its median
    run (:func:`median_run`)."""
    fields = SITES[shape].fields
    site = Site(n, shape)
    try:
        # Scrapy before and after each aiworker run: each run's ratio is against the
        # two Scrapy runs beside it (the machine's load drifts over minutes)
        scrapys = [run_scrapy(site.base, shape)]
        runs = []
        for v in variants * repeats:
            limiter, *parts = v.split("+")
            per_task = [int(f[len("tasks") :]) for f in parts if f.startswith("tasks")]
            flags = [f"--{f}" for f in parts if not f.startswith("tasks")]
            runs.append(
                await run_aiworker(
                    site.base, n, limiter == "on", flags, per_task[0] if per_task else 1, fields
                )
            )
            scrapys.append(run_scrapy(site.base, shape))
    finally:
        site.stop()
    rows = []
    for s in scrapys:
        items = s.pop("items")
        rows.append(
            {
                "pages": len(items),
                "wall_seconds": round(s["elapsed"], 2),
                "pages_per_s": round(len(items) / s["elapsed"], 2),
                "cpu_s_per_page": round(s["cpu"] / len(items), 5),
                "peak_rss_mb": round(s["maxrss_mb"], 1),
                "_items": items,
            }
        )
    scrapy_items = rows[0].pop("_items")
    for r in rows[1:]:
        r.pop("_items")
    out: dict[str, Any] = {
        "site": shape,
        "site_is": SITES[shape].about,
        "pages": n,
        "concurrency": CONCURRENCY,
        "scrapy": {
            k: statistics.median(r[k] for r in rows)
            for k in ("pages_per_s", "cpu_s_per_page", "peak_rss_mb")
        }
        | {"runs": rows},
    }
    paired: dict[str, list[dict[str, Any]]] = {}
    for i, r in enumerate(runs):
        items = r.pop("_items")
        beside = (rows[i]["pages_per_s"] + rows[i + 1]["pages_per_s"]) / 2
        cpu_beside = (rows[i]["cpu_s_per_page"] + rows[i + 1]["cpu_s_per_page"]) / 2
        r["scrapy_pages_per_s_beside"] = round(beside, 2)
        r["ratio_to_scrapy"] = round(r["pages_per_s"] / beside, 3)
        r["cpu_ratio_to_scrapy"] = round(r["cpu_s_per_page"]["total"] / cpu_beside, 2)
        r["fields"] = _agreement(items, scrapy_items, fields)
        key = "+".join([r["limiter"], *r["dev_flags"].split()])
        if r["items_per_task"] > 1:
            key += f"+items_per_task_{r['items_per_task']}"
        paired.setdefault("aiworker_limiter_" + key, []).append(r)
    reported = []  # each variant's median run, in the variants' order
    for key, repeated in paired.items():
        out[key] = median_run(repeated)
        reported.append(out[key])
    # the shipped recommendation: items_per_task where a variant ran it, else limiter on
    batched = [r for r in reported if r["items_per_task"] > 1 and r["limiter"] == "on"]
    headline = batched[0] if batched else reported[0]
    out["ratio"] = headline["ratio_to_scrapy"]
    out["ratio_is"] = f"aiworker (limiter {headline['limiter']}) pages/s / Scrapy pages/s" + (
        f", items_per_task {headline['items_per_task']}" if headline["items_per_task"] > 1 else ""
    )
    one = [r for r in reported if r["items_per_task"] == 1 and r["limiter"] == "on"]
    if one:
        out["ratio_one_item_per_task"] = one[0]["ratio_to_scrapy"]
    out["field_agreement"] = min(r["fields"]["agreement"] for rs in paired.values() for r in rs)
    out["repeats"] = repeats
    return out


def median_run(repeated: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of one variant whose ratio to the Scrapy runs beside it is the
    median of its repeats (the lower of the middle two for an even count), with
    every repeat's paired ratio in order (``ratio_runs``): one run's figures,
    never a mix of several."""
    ratios = [r["ratio_to_scrapy"] for r in repeated]
    middle = statistics.median_low(ratios)
    chosen = dict(repeated[ratios.index(middle)])
    if len(repeated) > 1:
        chosen["ratio_runs"] = ratios
    return chosen


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        asyncio.run(_serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "scrapy":
        _scrapy_main(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        standalone(run)
