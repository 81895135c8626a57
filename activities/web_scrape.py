"""The ``web-scrape`` worker: fetch a page, extract what a spec asks, normalize it.

Input ``{url, extraction_spec, user_agent?, respect_robots?, allow_domains?,
render?, wait_for?}``; output ``{data, source, warnings}``. ``render: "browser"``
loads the page in headless Chromium through the ``render`` tool
(``activities/tools/browser.py``) and extracts from the rendered DOM. The
extraction spec is compiled before any fetch (a bad spec is ``invalid_input``
and costs no request). The raw page (the rendered DOM when rendered) goes to
the artifact store and travels as an ``ArtifactRef``, never inline. Fetch
failures carry their codes from the ``fetch_url`` tool; a page whose markup
lost required fields returns ``partial`` with one warning per missing field.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import InvalidInputError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.activities.tools.browser import BrowserTool
from aiworker.activities.tools.extract import HtmlParser
from aiworker.activities.tools.fetch import FetchTool
from aiworker.schemas.catalog import builtin_spec
from aiworker.schemas.extraction_spec import SpecError, compile_selector
from aiworker.schemas.protocol import WarningInfo

# Leave the runtime's own deadline a margin, so a slow site is `fetch_timeout`
# (with the URL) and not the generic `timeout`.
_DEADLINE_MARGIN = 0.1
_MIN_MARGIN_SECONDS = 0.05
_MAX_MARGIN_SECONDS = 1.0
_INLINE_PARSE_CHARS = 512 * 1024


class WebScrape(Worker):
    """Fetches one page and extracts the fields of an ``extraction_spec``."""

    spec = builtin_spec("web-scrape")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        parser: HtmlParser = ctx.tools.use("parse_html")
        try:
            spec = parser.compile(input["extraction_spec"])
        except SpecError as e:
            raise InvalidInputError(
                f"input.{e.path}: {e.message}", field=f"input.{e.path}"
            ) from None
        wait_for = _wait_for(input)
        store: ArtifactStore = ctx.tools.use("artifact_store")
        remaining = ctx.remaining()
        margin = min(_MAX_MARGIN_SECONDS, max(_MIN_MARGIN_SECONDS, remaining * _DEADLINE_MARGIN))
        fetch_args: dict[str, Any] = {
            "timeout": max(0.001, remaining - margin),
            "user_agent": input.get("user_agent"),
            "respect_robots": input.get("respect_robots", True),
            "allow_domains": input.get("allow_domains"),
        }
        rendered = None
        if input.get("render") == "browser":
            browser: BrowserTool = ctx.tools.use("render")
            rendered = await browser.render(input["url"], wait_for=wait_for, **fetch_args)
            page, text = rendered.page, rendered.html
            body, media_type = text.encode("utf-8"), "text/html"
        else:
            fetcher: FetchTool = ctx.tools.use("fetch_url")
            page = await fetcher.fetch(input["url"], **fetch_args)
            text, body = page.text, page.body
            media_type = page.content_type.split(";", 1)[0].strip() or "text/html"
        ref = await store.put(ctx.request.tenant, body, media_type)
        if len(text) > _INLINE_PARSE_CHARS:
            # Big pages parse in a thread so the event loop keeps serving other activities.
            result = await asyncio.to_thread(parser.extract, text, spec, page.final_url)
        else:
            result = parser.extract(text, spec, page.final_url)
        source = page.source()
        source["redirects"] = page.redirects
        warnings = list(result.warnings)
        if rendered is not None:
            source["browser"] = rendered.summary()
            if not rendered.waited:
                warnings.append(
                    {
                        "code": "wait_for_timeout",
                        "message": f"wait_for {wait_for or 'load'} did not happen before the "
                        "deadline; extracted from the page as it was",
                        "field": "input.wait_for",
                    }
                )
        return WorkerResult(
            outputs={"data": result.data, "source": source, "warnings": warnings},
            status="partial"
            if result.missing_required or (rendered is not None and not rendered.waited)
            else "succeeded",
            warnings=[WarningInfo(**w) for w in warnings],
            artifacts=[ref],
            log_fields={
                "final_url": page.final_url,
                "status_code": page.status_code,
                "bytes": len(page.body),
                "missing_fields": len(result.missing_required),
            },
        )


def _wait_for(input: dict[str, Any]) -> str | None:
    """``input.wait_for``, checked: only with ``render: "browser"``, a CSS selector or
    ``networkidle``."""
    wait_for: str | None = input.get("wait_for")
    if wait_for is None:
        return None
    if input.get("render") != "browser":
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
