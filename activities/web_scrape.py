"""The ``web-scrape`` worker: fetch a page, extract what a spec asks, normalize it.

Input ``{url, extraction_spec?, discover?, user_agent?, respect_robots?,
allow_domains?, cache?, render?, wait_for?}``; output ``{data, source, warnings}``. The
extraction spec is compiled before any fetch (a bad spec is ``invalid_input``
and costs no request). The raw page (the rendered DOM when rendered) goes to
the artifact store and travels as an ``ArtifactRef``, never inline. Fetch
failures carry their codes from the ``fetch_url`` tool; a page whose markup
lost required fields returns ``partial`` with one warning per missing field.

- ``render: "browser"`` loads the page in headless Chromium through the
  ``render`` tool (``activities/tools/browser.py``) and extracts from the
  rendered DOM.
- Conditional requests (``activities.tools.revalidate``): a page that
  answers ``304`` returns the previous extraction with
  ``source.not_modified: true``; ``cache: "off"`` turns them off. A rendered
  page is never revalidated: a ``304`` for its document says nothing about
  the scripts and data its content comes from.
- ``extraction_spec.content`` adds ``data.content``, the page's main text as
  text and Markdown (:mod:`aiworker.activities.tools.content`).
- ``discover`` adds ``data.urls`` (:mod:`aiworker.activities.tools.discover`);
  with sitemaps only, the page itself is not fetched. A discover step makes
  no conditional request (a page that did not change says nothing of its
  sitemaps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bs4 import BeautifulSoup

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import InvalidInputError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.activities.tools.browser import BrowserTool
from aiworker.activities.tools.discover import discover_urls
from aiworker.activities.tools.extract import Extraction, HtmlParser
from aiworker.activities.tools.fetch import FetchResult, FetchTool
from aiworker.activities.tools.revalidate import NotModified, PageValidators, Revalidation
from aiworker.config.catalog import builtin_spec
from aiworker.schemas.discover_spec import DiscoverSpec, compile_discover
from aiworker.schemas.extraction_spec import CompiledSpec, SpecError, compile_selector
from aiworker.schemas.protocol import WarningInfo

# Leave the runtime's own deadline a margin, so a slow site is `fetch_timeout`
# (with the URL) and not the generic `timeout`.
_DEADLINE_MARGIN = 0.1
_MIN_MARGIN_SECONDS = 0.05
_MAX_MARGIN_SECONDS = 1.0
_INLINE_PARSE_CHARS = 512 * 1024


def _time_left(remaining: float) -> float:
    """What a fetch or an extraction may take of the call's ``remaining`` seconds."""
    margin = min(_MAX_MARGIN_SECONDS, max(_MIN_MARGIN_SECONDS, remaining * _DEADLINE_MARGIN))
    return max(0.001, remaining - margin)


class WebScrape(Worker):
    """Fetches one page and extracts the fields of an ``extraction_spec``."""

    spec = builtin_spec("web-scrape")

    def __init__(self) -> None:
        # the conditional-request store of the last artifact store and data directory
        # seen: built once per process, not per call (it resolves its directory)
        self._validators: tuple[ArtifactStore, Path, PageValidators] | None = None

    def _page_validators(self, store: ArtifactStore, data_dir: Path) -> PageValidators:
        known = self._validators
        if known is None or known[0] is not store or known[1] != data_dir:
            known = (store, data_dir, PageValidators.beside(store, data_dir))
            self._validators = known
        return known[2]

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        parser: HtmlParser = ctx.tools.use("parse_html")
        try:
            spec = parser.compile(input["extraction_spec"]) if "extraction_spec" in input else None
            find = compile_discover(input["discover"]) if "discover" in input else None
        except SpecError as e:
            raise InvalidInputError(
                f"input.{e.path}: {e.message}", field=f"input.{e.path}"
            ) from None
        if spec is None and find is None:
            raise InvalidInputError(
                "input: a web-scrape step needs extraction_spec, discover or both", field="input"
            )
        if find is not None and spec is not None and any(f.name == "urls" for f in spec.fields):
            raise InvalidInputError(
                "input.extraction_spec.fields.urls: with discover, data.urls holds the URLs found",
                field="input.extraction_spec.fields.urls",
            )
        wait_for = _wait_for(input)
        store: ArtifactStore = ctx.tools.use("artifact_store")
        if find is not None and not find.links and spec is None:
            # Sitemaps only: the page itself is not fetched.
            urls, found = await discover_urls(
                ctx.tools.use("fetch_url"), find, input, None, _time_left(ctx.remaining())
            )
            return WorkerResult(
                outputs={
                    "data": {"urls": urls},
                    "source": found.sitemap_source(),
                    "warnings": found.warnings,
                },
                status="partial" if found.incomplete else "succeeded",
                warnings=[WarningInfo(**w) for w in found.warnings],
                log_fields={"urls": len(urls), "discover_fetches": found.fetches},
            )
        fetch_args: dict[str, Any] = {
            "user_agent": input.get("user_agent"),
            "respect_robots": input.get("respect_robots", True),
            "allow_domains": input.get("allow_domains"),
        }
        rendered = None
        fetcher: FetchTool
        revalidation: Revalidation | None = None
        if input.get("render") == "browser":
            browser: BrowserTool = ctx.tools.use("render")
            fetcher = browser.fetcher  # discovery's fetches: the same guarded fetcher
            rendered = await browser.render(
                input["url"], wait_for=wait_for, timeout=_time_left(ctx.remaining()), **fetch_args
            )
            page, text = rendered.page, rendered.html
            body, media_type = text.encode("utf-8"), "text/html"
        else:
            fetcher = ctx.tools.use("fetch_url")
            revalidation = self._page_validators(store, ctx.settings.data_dir).session(
                ctx.tenant,
                input,
                self.spec.version,
                enabled=input.get("cache", "on") != "off" and find is None,
            )

            async def fetch(conditional: tuple[str, Mapping[str, str]] | None) -> FetchResult:
                return await fetcher.fetch(
                    input["url"],
                    timeout=_time_left(ctx.remaining()),
                    conditional=conditional,
                    **fetch_args,
                )

            fetched = await revalidation.fetch(fetch)
            if isinstance(fetched, NotModified):
                return WorkerResult(
                    outputs=fetched.outputs,
                    warnings=[WarningInfo(**w) for w in fetched.outputs["warnings"]],
                    artifacts=fetched.artifacts,
                    log_fields={
                        "final_url": fetched.outputs["source"]["final_url"],
                        "status_code": 304,
                        "not_modified": True,
                    },
                )
            page = fetched
            text, body = page.text, page.body
            media_type = page.content_type.split(";", 1)[0].strip() or "text/html"
        ref = await store.put(ctx.request.tenant, body, media_type)
        result, warnings, partial, log_fields = await self._extract(
            ctx, input, parser, spec, find, fetcher, page.final_url, text
        )
        source = page.source()
        source["redirects"] = page.redirects
        source["not_modified"] = False
        if rendered is not None:
            source["browser"] = rendered.summary()
            if not rendered.waited:
                partial = True
                warnings.append(
                    {
                        "code": "wait_for_timeout",
                        "message": f"wait_for {wait_for or 'load'} did not happen before the "
                        "deadline; extracted from the page as it was",
                        "field": "input.wait_for",
                    }
                )
        outputs = {"data": result.data, "source": source, "warnings": warnings}
        if revalidation is not None and not partial:  # only a succeeded extraction
            await revalidation.remember(page, ref, outputs)
        return WorkerResult(
            outputs=outputs,
            status="partial" if partial else "succeeded",
            warnings=[WarningInfo(**w) for w in warnings],
            artifacts=[ref],
            log_fields={
                "final_url": page.final_url,
                "status_code": page.status_code,
                "bytes": len(page.body),
                "missing_fields": len(result.missing_required),
                **log_fields,
            },
        )

    async def _extract(
        self,
        ctx: WorkerContext,
        worker_input: dict[str, Any],
        parser: HtmlParser,
        spec: CompiledSpec | None,
        find: DiscoverSpec | None,
        fetcher: FetchTool,
        final_url: str,
        text: str,
    ) -> tuple[Extraction, list[dict[str, str]], bool, dict[str, Any]]:
        """Fields, content and discovered URLs of the page ``text`` fetched from
        ``final_url``: the extraction, its warnings, whether it is partial, log fields."""

        def parse_and_extract() -> tuple[BeautifulSoup | None, Extraction]:
            if find is None and spec is not None:
                # only the fields read the tree: the parser picks it (lxml's own where
                # the spec means the same there, an eighth of BeautifulSoup's cost)
                return None, parser.extract(text, spec, final_url)
            # one BeautifulSoup parse serves the fields and the discovered links
            soup = parser.parse(text)
            if spec is None:
                return soup, Extraction(data={})
            return soup, parser.extract_from(soup, spec, final_url, source=text)

        soup: BeautifulSoup | None = None
        if not _needs_tree(spec, find):
            # content only: trafilatura parses the page itself (lxml); a tree nobody
            # reads cost more than the extraction (bench/article.py)
            result = Extraction(data={})
        elif len(text) > _INLINE_PARSE_CHARS:
            # Big pages parse in a thread so the event loop keeps serving other activities.
            soup, result = await asyncio.to_thread(parse_and_extract)
        else:
            soup, result = parse_and_extract()
        partial = bool(result.missing_required)
        warnings = list(result.warnings)
        if spec is not None and spec.content is not None:
            # imported on first use: trafilatura takes ~0.2 s to import, which a
            # process whose steps never ask for content should not pay
            from aiworker.activities.tools.content import main_content

            content = await main_content(
                text,
                spec.content,
                final_url,
                max_chars=spec.max_content_chars,
                timeout=_time_left(ctx.remaining()),
            )
            result.data["content"] = content.content
            warnings.extend(content.warnings)
            partial = partial or content.partial
        log_fields: dict[str, Any] = {}
        if find is not None:
            urls, found = await discover_urls(
                fetcher,
                find,
                worker_input,
                (soup, final_url) if soup is not None else None,
                _time_left(ctx.remaining()),
            )
            result.data["urls"] = urls
            warnings.extend(found.warnings)
            partial = partial or found.incomplete
            log_fields = {"urls": len(urls), "discover_fetches": found.fetches}
        return result, warnings, partial, log_fields


def _needs_tree(spec: CompiledSpec | None, find: DiscoverSpec | None) -> bool:
    """Whether anything reads a tree of the page: fields, ``metadata`` or discovery (a
    discover step always reads the page it fetched)."""
    return find is not None or spec is None or bool(spec.fields) or spec.metadata


def _wait_for(worker_input: dict[str, Any]) -> str | None:
    """``input.wait_for``, checked: only with ``render: "browser"``, a CSS selector or
    ``networkidle``."""
    wait_for: str | None = worker_input.get("wait_for")
    if wait_for is None:
        return None
    if worker_input.get("render") != "browser":
        raise InvalidInputError(
            'input.wait_for: takes effect only with "render": "browser"', field="input.wait_for"
        )
    if wait_for != "networkidle":
        try:
            compile_selector(wait_for, "wait_for")
        except SpecError as e:
            raise InvalidInputError(
                f"input.{e.path}: {e.message}", field="input.wait_for"
            ) from None
    return wait_for
