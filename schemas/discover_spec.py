"""The ``discover`` input of a web-scrape step: checked and compiled, no I/O.

``discover`` asks the step for URLs (``data.urls``, for a ``for_each``) instead
of, or beside, fields::

    {"sitemap": true | "https://site/sitemap.xml",
     "links": true | {"selector": "a.product"},
     "pattern": "/item/[0-9]+$",
     "same_site": true,
     "max_urls": 1000}

``sitemap: true`` reads the sitemaps the site's robots.txt names (``Sitemap:``
lines), else ``/sitemap.xml``; a URL reads that sitemap. ``links`` takes the
``href`` of the page's links: every ``a[href]``, or the elements a CSS
selector (soupsieve, as extraction uses) matches. ``pattern`` is an RE2
regular expression searched in each absolute URL, from either source.

Compiled by the worker and by ``aiworker check`` alike (the same function), so
a bad selector or pattern is ``invalid_input`` naming its JSON path before
anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.schemas.extraction_spec import SpecError, compile_selector
from aiworker.schemas.patterns import PatternError, compile_pattern

DEFAULT_MAX_URLS = 1000
# The schema's maximum too: a for_each over more items needs batches of steps anyway.
MAX_URLS = 10_000


@dataclass(frozen=True)
class DiscoverSpec:
    """A compiled ``discover``.

    Attributes:
        sitemap: None (no sitemap), ``""`` (the site's own), or a sitemap URL.
        links: whether to take the page's links.
        selector: the compiled CSS selector of link elements, or None (``a[href]``).
        pattern: the compiled RE2 pattern every URL must match, or None.
        same_site: keep only URLs of the page's own site.
        max_urls: the most URLs returned.
    """

    sitemap: str | None
    links: bool
    selector: Any
    pattern: Any
    same_site: bool
    max_urls: int


def compile_discover(value: Any, path: str = "discover") -> DiscoverSpec:
    """Check and compile ``discover``; :class:`SpecError` names the JSON path at fault."""
    if not isinstance(value, dict):
        raise SpecError(path, "must be an object")
    sitemap = value.get("sitemap", False)
    if sitemap is True:
        site_map: str | None = ""
    elif sitemap is False or sitemap is None:
        site_map = None
    elif isinstance(sitemap, str) and sitemap.lower().startswith(("http://", "https://")):
        site_map = sitemap
    else:
        raise SpecError(f"{path}.sitemap", "must be true, false or an http(s) URL")
    links = value.get("links", False)
    selector = None
    if isinstance(links, dict):
        if "selector" in links:
            selector = compile_selector(links["selector"], f"{path}.links.selector")
        links = True
    elif not isinstance(links, bool):
        raise SpecError(f"{path}.links", 'must be true, false or {"selector": ...}')
    if site_map is None and not links:
        raise SpecError(path, 'names no source: set "sitemap", "links" or both')
    pattern = None
    if "pattern" in value:
        try:
            pattern = compile_pattern(value["pattern"])
        except PatternError as e:
            raise SpecError(f"{path}.pattern", str(e)) from None
    same_site = value.get("same_site", True)
    if not isinstance(same_site, bool):
        raise SpecError(f"{path}.same_site", "must be true or false")
    max_urls = value.get("max_urls", DEFAULT_MAX_URLS)
    if isinstance(max_urls, bool) or not isinstance(max_urls, int) or not 1 <= max_urls <= MAX_URLS:
        raise SpecError(f"{path}.max_urls", f"must be an integer from 1 to {MAX_URLS}")
    return DiscoverSpec(site_map, bool(links), selector, pattern, same_site, max_urls)
