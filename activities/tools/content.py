"""Main content of a page (``extraction_spec.content``), as text and as Markdown.

``"article"`` runs trafilatura on the page: the main text with navigation,
ads, comments and other boilerplate removed, rendered once as Markdown
(headings, lists, links, tables, emphasis) and once as plain text (the same
tree with link targets and markup dropped), plus trafilatura's title, author
(``byline``) and date (``published``, from htmldate); ``language`` comes from
the page's ``lang`` attribute or ``Content-Language``. ``"page"`` renders every
visible element instead (:mod:`.page_markdown`).

Why trafilatura, and with which options: ``bench/article_eval.py`` measures
extractors on the public article-extraction benchmark (181 pages with
hand-labelled bodies, shingle F1 as its ``evaluate.py`` computes it); see
``docs/scrape-content.md`` for the figures. ``favor_precision`` scored best;
links are kept in the Markdown only, since URLs in the text would be noise for
a model (and cost F1).

What bounds it: the HTML is the fetcher's, already capped in bytes
(``FetchLimits.max_bytes``, 5 MiB); lxml's HTML parser stops nesting at 256
levels; trafilatura and the page renderer are linear passes over the tree
(a 1.6 MB page of one 100,000-cell table takes about 3.5 s on one core).
:func:`main_content` runs the extraction in a small dedicated thread pool
(:data:`MAX_THREADS`, so runaway pages cannot pile up threads) and waits at
most the call's remaining time: past it the step gets a ``content_timeout``
warning and ``partial``, never a hung activity. A page of at most
:data:`INLINE_CHARS` characters with at least :data:`INLINE_MIN_SECONDS` left
is extracted inline instead: at the rate above it cannot reach the deadline.
An extraction that is already running in the pool cannot be stopped from
outside; it finishes in the background, bounded by the input size.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import trafilatura
from lxml.etree import strip_tags  # type: ignore[import-untyped]
from trafilatura.xml import xmltotxt

from aiworker.activities.tools.page_markdown import render

MODES = ("article", "page")
MAX_THREADS = 2
# Pages up to this size are extracted on the event loop when at least
# INLINE_MIN_SECONDS are left (see main_content), like web-scrape's inline parse.
INLINE_CHARS = 64 * 1024
INLINE_MIN_SECONDS = 5.0
# Fewer words than this in an article's body means the page showed none
# (a login wall, a consent page, an empty JavaScript shell).
MIN_ARTICLE_WORDS = 20

# The configuration bench/article_eval.py chose (see the module docstring).
ARTICLE_OPTIONS: dict[str, Any] = {
    "favor_precision": True,
    "include_comments": False,
    "include_tables": True,
    "include_links": True,
    "include_formatting": True,
    "with_metadata": True,
}

_POOL = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="aiworker-content")
# trafilatura logs every discarded page at WARNING; an empty page is reported
# to the caller as a warning of its own, so the library's line is noise.
logging.getLogger("trafilatura").setLevel(logging.ERROR)
logging.getLogger("htmldate").setLevel(logging.ERROR)


@dataclass
class ContentResult:
    """``data.content``, its warnings, and whether they make the step ``partial``."""

    content: dict[str, Any]
    warnings: list[dict[str, str]] = field(default_factory=list)
    partial: bool = False


def extract_content(html: str, mode: str, base_url: str) -> dict[str, Any]:
    """``data.content`` of one page: ``text``, ``markdown``, ``title``, ``byline``,
    ``published``, ``language`` (``null`` where not found). Never raises on any HTML.

    Args:
        html: the decoded page.
        mode: ``"article"`` (main text only) or ``"page"`` (all visible text).
        base_url: the page's final URL, to make links absolute.
    """
    out = _empty(mode)
    tree = trafilatura.load_html(html)
    if tree is None:
        return out
    out["language"] = _language(tree)
    if mode == "article":
        doc = trafilatura.bare_extraction(tree, url=base_url, **ARTICLE_OPTIONS)
        if isinstance(doc, trafilatura.settings.Document) and doc.body is not None:
            plain = copy.deepcopy(doc.body)  # rendering changes the tree: text from a copy
            strip_tags(plain, "ref")  # link text stays, its target goes
            out["text"] = xmltotxt(plain, False).strip()
            # bare_extraction already rendered the body with formatting (Markdown) for
            # doc.text, from a copy of it: rendering it again would do the same work twice
            out["markdown"] = (doc.text or "").strip()
            meta = doc
        else:
            meta = trafilatura.extract_metadata(tree, base_url)
    else:
        body = tree.find(".//body")
        out["markdown"], out["text"] = render(body if body is not None else tree, base_url)
        meta = trafilatura.extract_metadata(tree, base_url)
    out["title"] = meta.title or None
    out["byline"] = meta.author or None
    out["published"] = meta.date or None
    out["language"] = out["language"] or meta.language or None
    return out


async def main_content(
    html: str,
    mode: str,
    base_url: str,
    *,
    max_chars: int | None,
    timeout: float,  # noqa: ASYNC109 - the step's remaining time, for asyncio.wait_for
) -> ContentResult:
    """:func:`extract_content` in the content thread pool, within ``timeout`` seconds,
    then the checks a caller needs: no main content, truncation to ``max_chars``.

    Warnings (``field`` is ``content``): ``no_main_content`` and
    ``content_timeout`` make the result ``partial``; ``truncated`` does not.

    Args:
        html: the decoded page (already capped in size by the fetcher).
        mode: ``"article"`` or ``"page"``.
        base_url: the page's final URL, to make links absolute.
        max_chars: ``max_content_chars``, or ``None`` for no cut.
        timeout: seconds left for the extraction (the step's remaining time).
    """
    loop = asyncio.get_running_loop()
    try:
        if len(html) <= INLINE_CHARS and timeout >= INLINE_MIN_SECONDS:
            # A page this small cannot take anywhere near the time left (linear: a
            # 64 KiB table page, the worst kind, about 0.2 s), so the deadline holds
            # without the pool, and the step saves the hop to a thread and back (two
            # scheduler wake-ups per page, bench/article.py).
            content = extract_content(html, mode, base_url)
        else:
            content = await asyncio.wait_for(
                loop.run_in_executor(_POOL, extract_content, html, mode, base_url),
                max(0.001, timeout),
            )
    except TimeoutError:
        return ContentResult(
            content=_empty(mode),
            warnings=[
                _warning(
                    "content_timeout",
                    f"extracting the {mode} content took longer than the "
                    f"{timeout:.3g}s left of the step's deadline",
                )
            ],
            partial=True,
        )
    result = ContentResult(content=content)
    words = len(content["text"].split())
    if words < (MIN_ARTICLE_WORDS if mode == "article" else 1):
        found = "no text" if not words else f"only {words} words"
        what = "main content" if mode == "article" else "visible text"
        result.warnings.append(
            _warning(
                "no_main_content",
                f"no {what} found ({found}): a login wall, a consent page, or a page "
                "that renders with JavaScript",
            )
        )
        result.partial = True
    if max_chars is not None:
        sizes = {k: len(content[k]) for k in ("text", "markdown")}
        if max(sizes.values()) > max_chars:
            for k in sizes:
                content[k] = truncate(content[k], max_chars)
            result.warnings.append(
                _warning(
                    "truncated",
                    f"content cut to max_content_chars ({max_chars}): text had "
                    f"{sizes['text']} characters, markdown {sizes['markdown']}",
                )
            )
    return result


def truncate(s: str, limit: int) -> str:
    """``s`` cut to at most ``limit`` characters, at a word boundary when one is near."""
    if len(s) <= limit:
        return s
    cut = s[:limit]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if space > limit * 0.8:
        cut = cut[:space]
    return cut.rstrip()


def _empty(mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "text": "",
        "markdown": "",
        "title": None,
        "byline": None,
        "published": None,
        "language": None,
    }


def _language(tree: Any) -> str | None:
    lang = tree.get("lang") or tree.get("xml:lang")
    if not lang:
        for meta in tree.iterfind(".//meta[@http-equiv]"):
            if meta.get("http-equiv", "").lower() == "content-language":
                lang = meta.get("content")
                break
    lang = (lang or "").strip()
    return lang or None


def _warning(code: str, message: str) -> dict[str, str]:
    return {"code": code, "field": "content", "message": message}
