"""The ``web-scrape`` worker: fetch a page, extract what a spec asks, normalize it.

Input ``{url, extraction_spec?, discover?, user_agent?, respect_robots?,
allow_domains?, cache?}``; output ``{data, source, warnings}``. The extraction
spec is compiled before any fetch (a bad spec is ``invalid_input`` and costs no request). The raw
page goes to the artifact store and travels as an ``ArtifactRef``, never
inline. Fetch failures carry their codes from the ``fetch_url`` tool; a page
whose markup lost required fields returns ``partial`` with one warning per
missing field. Conditional requests (``activities.tools.revalidate``): a
page that answers ``304`` returns the previous extraction with
``source.not_modified: true``; ``cache: "off"`` turns them off.
``extraction_spec.content`` adds ``data.content``, the page's main text as
text and Markdown (:mod:`aiworker.activities.tools.content`). ``discover``
adds ``data.urls`` (:mod:`aiworker.activities.tools.discover`); a step with
it makes no conditional request (a page that did not change says nothing of
its sitemaps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import InvalidInputError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.activities.tools.discover import discover_urls
from aiworker.activities.tools.extract import Extraction, HtmlParser
from aiworker.activities.tools.fetch import FetchResult, FetchTool
from aiworker.activities.tools.revalidate import NotModified, PageValidators
from aiworker.schemas.catalog import builtin_spec
from aiworker.schemas.discover_spec import compile_discover
from aiworker.schemas.extraction_spec import SpecError
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

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
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
        store: ArtifactStore = ctx.tools.use("artifact_store")
        fetcher: FetchTool = ctx.tools.use("fetch_url")
        if find is not None and not find.links and spec is None:
            # Sitemaps only: the page itself is not fetched.
            urls, found = await discover_urls(
                fetcher, find, input, None, _time_left(ctx.remaining())
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

        async def fetch(conditional: tuple[str, Mapping[str, str]] | None) -> FetchResult:
            return await fetcher.fetch(
                input["url"],
                timeout=_time_left(ctx.remaining()),
                user_agent=input.get("user_agent"),
                respect_robots=input.get("respect_robots", True),
                allow_domains=input.get("allow_domains"),
                conditional=conditional,
            )

        revalidation = PageValidators.beside(store, ctx.settings.data_dir).session(
            ctx.tenant,
            input,
            self.spec.version,
            enabled=input.get("cache", "on") != "off" and find is None,
        )
        page = await revalidation.fetch(fetch)
        if isinstance(page, NotModified):
            return WorkerResult(
                outputs=page.outputs,
                warnings=[WarningInfo(**w) for w in page.outputs["warnings"]],
                artifacts=page.artifacts,
                log_fields={
                    "final_url": page.outputs["source"]["final_url"],
                    "status_code": 304,
                    "not_modified": True,
                },
            )
        media_type = page.content_type.split(";", 1)[0].strip() or "text/html"
        ref = await store.put(ctx.request.tenant, page.body, media_type)
        result = Extraction(data={})
        if spec is None:
            pass
        elif len(page.text) > _INLINE_PARSE_CHARS:
            # Big pages parse in a thread so the event loop keeps serving other activities.
            result = await asyncio.to_thread(parser.extract, page.text, spec, page.final_url)
        else:
            result = parser.extract(page.text, spec, page.final_url)
        partial = bool(result.missing_required)
        if spec is not None and spec.content is not None:
            # imported on first use: trafilatura takes ~0.2 s to import, which a
            # process whose steps never ask for content should not pay
            from aiworker.activities.tools.content import main_content

            content = await main_content(
                page.text,
                spec.content,
                page.final_url,
                max_chars=spec.max_content_chars,
                timeout=_time_left(ctx.remaining()),
            )
            result.data["content"] = content.content
            result.warnings.extend(content.warnings)
            partial = partial or content.partial
        log_fields: dict[str, Any] = {}
        if find is not None:
            soup = parser.parse(page.text)
            urls, found = await discover_urls(
                fetcher, find, input, (soup, page), _time_left(ctx.remaining())
            )
            result.data["urls"] = urls
            result.warnings.extend(found.warnings)
            partial = partial or found.incomplete
            log_fields = {"urls": len(urls), "discover_fetches": found.fetches}
        source = page.source()
        source["redirects"] = page.redirects
        source["not_modified"] = False
        outputs = {"data": result.data, "source": source, "warnings": result.warnings}
        if not partial:  # only a succeeded extraction is remembered
            await revalidation.remember(page, ref, outputs)
        return WorkerResult(
            outputs=outputs,
            status="partial" if partial else "succeeded",
            warnings=[WarningInfo(**w) for w in result.warnings],
            artifacts=[ref],
            log_fields={
                "final_url": page.final_url,
                "status_code": page.status_code,
                "bytes": len(page.body),
                "missing_fields": len(result.missing_required),
                **log_fields,
            },
        )
