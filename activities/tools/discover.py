"""URL discovery for a web-scrape step: sitemaps and a page's links, bounded.

:class:`Discovery` collects the URLs a ``discover`` input asks for
(:mod:`~aiworker.schemas.discover_spec`) in the order found, without
duplicates, and keeps only those that pass, in this order: http(s) only,
same site (unless ``same_site: false``), ``pattern``, robots.txt (unless the
step has ``respect_robots: false``). Robots-disallowed URLs are dropped and
counted in one warning.

Sitemaps (sitemaps.org: ``<urlset>`` of ``<url><loc>``, ``<sitemapindex>`` of
``<sitemap><loc>``, plain or gzip) are stream-parsed while the body arrives
(:mod:`~aiworker.activities.tools.sitemap_stream`: memory flat, gzip bombs
capped), and reading stops at ``max_urls``. Depth is 1: a sitemap index's
child sitemaps are read, an index inside an index is not. One discovery makes
at most :data:`MAX_FETCHES` fetches (sitemaps, and robots.txt of other origins).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from bs4 import BeautifulSoup
from lxml import etree  # type: ignore[import-untyped]
from protego import Protego

from aiworker.activities.errors import (
    AccessDeniedError,
    FetchFailedError,
    FetchTimeoutError,
    InvalidInputError,
    PayloadTooLargeError,
    WorkerError,
)
from aiworker.activities.tools.fetch import FetchTool
from aiworker.activities.tools.sitemap_stream import (
    SITEMAP_MAX_BYTES,
    BodyRead,
    local_name,
)
from aiworker.activities.tools.sitemap_stream import (
    entries as read_entries,
)
from aiworker.schemas.discover_spec import DiscoverSpec

# Sitemaps read plus robots.txt files of other origins, for one discovery.
MAX_FETCHES = 20


def _site(host: str) -> str:
    """The site a host belongs to: itself without a leading ``www.``."""
    host = host.lower().rstrip(".")
    return host[4:] if host.startswith("www.") else host


@dataclass
class Discovery:
    """One discovery's URLs, warnings and counts.

    Args:
        fetcher: the process's fetch tool (egress, robots, politeness, caps).
        spec: the compiled ``discover`` input.
        page_url: the step's ``url``: its site is the "same site".
        deadline: ``time.monotonic()`` by which every fetch ends.
        user_agent: the step's user agent, or None for the default.
        respect_robots: apply robots.txt to the URLs returned (and fetches).
        allow_domains: the step's narrower egress allow-list.
    """

    fetcher: FetchTool
    spec: DiscoverSpec
    page_url: str
    deadline: float
    user_agent: str | None = None
    respect_robots: bool = True
    allow_domains: tuple[str, ...] = ()
    urls: dict[str, None] = field(default_factory=dict)
    warnings: list[dict[str, str]] = field(default_factory=list)
    fetches: int = 0
    incomplete: bool = False
    source: dict[str, Any] | None = None
    _full: bool = False
    _dropped: dict[str, int] = field(default_factory=dict)
    _rules: dict[str, Protego | None] = field(default_factory=dict)
    _home: str = ""

    def __post_init__(self) -> None:
        self._home = _site(urlsplit(self.page_url).hostname or "")

    @property
    def full(self) -> bool:
        """Whether ``max_urls`` is reached."""
        return self._full

    def warn(self, code: str, message: str, *, incomplete: bool = False) -> None:
        """Add a warning (under ``input.discover``); ``incomplete`` makes the step partial."""
        self.warnings.append({"code": code, "message": message, "field": "input.discover"})
        self.incomplete = self.incomplete or incomplete

    def finish(self) -> list[str]:
        """The URLs found, after the warnings that say what was dropped."""
        why = {
            "robots": "robots.txt disallows them for this user agent",
            "robots_unchecked": "their site's robots.txt could not be read within the "
            f"discovery's {MAX_FETCHES} fetches or was unavailable",
            "other_site": "they are on another site (same_site: false allows them)",
        }
        for reason, n in self._dropped.items():
            code = "urls_disallowed" if reason.startswith("robots") else "urls_dropped"
            self.warn(code, f"{n} URL(s) dropped: {why[reason]}")
        if self._full:
            self.warn("max_urls", f"stopped at max_urls ({self.spec.max_urls}); more URLs exist")
        return list(self.urls)

    def sitemap_source(self) -> dict[str, Any]:
        """The ``source`` block of a sitemaps-only step: the first sitemap read."""
        if self.source is None:  # the first sitemap either opened or failed the step
            raise FetchFailedError(
                f"no sitemap of {self.page_url} could be read", url=self.page_url
            )
        return self.source

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    async def offer(self, raw: str, base: str) -> bool:
        """Take ``raw`` (relative to ``base``) if it passes every filter; False once full."""
        if self._full:
            return False
        try:
            url, _ = urldefrag(urljoin(base, raw.strip()))
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            return True  # not a URL (a bad port, a broken IPv6 literal): not one to return
        if parts.scheme not in ("http", "https") or not host or url in self.urls:
            return True
        if self.spec.same_site and _site(host) != self._home:
            self._drop("other_site")
            return True
        if self.spec.pattern is not None and not self.spec.pattern.search(url):
            return True
        if self.respect_robots and not await self._allowed(url):
            return True
        if len(self.urls) >= self.spec.max_urls:
            self._full = True
            return False
        self.urls[url] = None
        return True

    async def _allowed(self, url: str) -> bool:
        p = urlsplit(url)
        origin = f"{p.scheme}://{p.netloc.lower()}"
        if origin not in self._rules:
            rules = None
            if self._budget():
                with contextlib.suppress(WorkerError):
                    rules = await self.rules(url)
            self._rules[origin] = rules
        rules = self._rules[origin]
        if rules is None:
            self._drop("robots_unchecked")
            return False
        if not rules.can_fetch(url, self.user_agent or self.fetcher.user_agent):
            self._drop("robots")
            return False
        return True

    async def rules(self, url: str) -> Protego:
        """The robots.txt rules of ``url``'s origin (the process's cache)."""
        return await self.fetcher.robots_rules(
            url,
            deadline=self.deadline,
            user_agent=self.user_agent,
            allow_domains=self.allow_domains,
        )

    def _budget(self) -> bool:
        if self.fetches >= MAX_FETCHES:
            return False
        self.fetches += 1
        return True

    # --- links -------------------------------------------------------------------------------

    async def from_page(self, soup: BeautifulSoup, page_url: str) -> None:
        """The page's links: ``href`` of every ``a[href]``, or of the selector's matches
        (an element without ``href`` gives its descendants' links)."""
        base_tag = soup.find("base", href=True)
        base = urljoin(page_url, str(base_tag["href"])) if base_tag is not None else page_url
        if self.spec.selector is None:
            elements = soup.select("a[href]")
        else:
            elements = self.spec.selector.select(soup)
        for el in elements:
            links = [el] if el.get("href") is not None else el.select("[href]")
            for link in links:
                if not await self.offer(str(link.get("href")), base):
                    return

    # --- sitemaps ----------------------------------------------------------------------------

    async def from_sitemaps(self, required: bool) -> None:
        """The sitemap's URLs: the one named, else robots.txt's ``Sitemap:`` lines, else
        ``/sitemap.xml``; the children of a sitemap index once. ``required``: a root
        sitemap that cannot be opened raises (no other source was asked for)."""
        named = self.spec.sitemap
        roots = [named] if named else await self._site_sitemaps()
        children: list[str] = []
        for root in roots:
            if self._full:
                return
            children += await self._read(root, root=True, required=required)
        for child in children:
            if self._full:
                return
            for nested in await self._read(child, root=False, required=False):
                self.warn(
                    "sitemap_depth",
                    f"{child} is a sitemap index inside an index; {nested} and its "
                    "siblings were not read (discovery reads one level)",
                    incomplete=True,
                )
                break

    async def _site_sitemaps(self) -> list[str]:
        found: list[str] = []
        if self.respect_robots:
            with contextlib.suppress(WorkerError):
                found = list((await self.rules(self.page_url)).sitemaps)
            # robots.txt may name sitemaps anywhere: under same_site only the site's own
            found = [url for url in found if not self._other_site_sitemap(url)]
        p = urlsplit(self.page_url)
        return found[:MAX_FETCHES] or [f"{p.scheme}://{p.netloc}/sitemap.xml"]

    def _other_site_sitemap(self, url: str) -> bool:
        """Whether ``url`` is a sitemap ``same_site`` keeps this discovery from reading
        (another site's: none of its URLs would be kept, and its site is not the
        one the step names); warns when it is."""
        try:
            host = urlsplit(url).hostname or ""
        except ValueError:
            host = ""
        if not self.spec.same_site or _site(host) == self._home:
            return False
        self.warn(
            "sitemap_other_site",
            f"{url[:300]} not read: it is on another site than {self.page_url[:300]} "
            "(same_site: false allows it)",
        )
        return True

    async def _read(self, url: str, *, root: bool, required: bool) -> list[str]:
        """Read one sitemap; return the child sitemaps it lists (an index)."""
        if self._other_site_sitemap(url):
            if root and required:  # the step's only source, named in its input
                raise InvalidInputError(
                    f"discover.sitemap {url[:300]} is on another site than the step's url "
                    f"{self.page_url[:300]}; same_site: false allows it",
                    field="input.discover.sitemap",
                )
            return []
        if not self._budget():
            self.warn(
                "sitemap_budget",
                f"{url} not read: one discovery makes at most {MAX_FETCHES} fetches",
                incomplete=True,
            )
            return []
        children: list[str] = []
        started = time.monotonic()
        fetched_at = _now()
        body = BodyRead()
        try:
            async with self.fetcher.stream(
                url,
                deadline=self.deadline,
                user_agent=self.user_agent,
                respect_robots=self.respect_robots,
                allow_domains=self.allow_domains,
            ) as (resp, final):
                if final != url and self._other_site_sitemap(final):  # redirected away
                    if root and required:
                        raise AccessDeniedError(
                            f"sitemap {url[:300]} redirects to another site ({final[:300]}); "
                            "same_site: false allows it",
                            url=url,
                        )
                    return []
                pieces = self.fetcher.iter_body(resp, url, SITEMAP_MAX_BYTES)
                entries = read_entries(pieces, url, body)
                try:
                    async with contextlib.aclosing(entries):
                        async for el in entries:
                            loc = el.findtext("{*}loc")
                            if not loc:
                                continue
                            if local_name(el.tag) == "sitemap":
                                if len(children) < MAX_FETCHES:
                                    children.append(urljoin(final, loc.strip()))
                            elif not await self.offer(loc, final):
                                break
                except PayloadTooLargeError as e:
                    self.warn("sitemap_truncated", e.message, incomplete=True)
                except etree.XMLSyntaxError as e:
                    self.warn(
                        "sitemap_invalid", f"{url} is not a valid sitemap: {e}", incomplete=True
                    )
                except WorkerError as e:
                    self.warn("sitemap_unavailable", e.message, incomplete=True)
                if self.source is None:
                    self.source = {
                        "url": self.page_url,
                        "final_url": final,
                        "status_code": resp.status,
                        "fetched_at": fetched_at,
                        "content_type": resp.headers.get("content-type", ""),
                        "encoding": "utf-8",
                        "bytes": body.size,
                        "sha256": body.sha256.hexdigest(),
                        "elapsed_ms": round((time.monotonic() - started) * 1000, 3),
                    }
        except WorkerError as e:
            if root and required and self.source is None:
                raise  # the step's only document: its code is the step's
            self.warn("sitemap_unavailable", e.message, incomplete=not root)
        return children


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def discover_urls(
    fetcher: FetchTool,
    spec: DiscoverSpec,
    worker_input: dict[str, Any],
    page: tuple[BeautifulSoup, str] | None,
    budget: float,
) -> tuple[list[str], Discovery]:
    """Run one step's discovery within ``budget`` seconds: the page's links (when
    ``page``, the parsed page and its final URL, is given and links are asked
    for), then sitemaps. Returns the URLs
    and the discovery (its warnings, ``incomplete``, ``source`` and fetch count).

    Without a ``page`` (sitemaps only) the first sitemap read is the step's
    ``source`` and failing to open it fails the step with its fetch code.
    """
    found = Discovery(
        fetcher,
        spec,
        worker_input["url"],
        deadline=time.monotonic() + budget,
        user_agent=worker_input.get("user_agent"),
        respect_robots=worker_input.get("respect_robots", True),
        allow_domains=tuple(worker_input.get("allow_domains") or ()),
    )
    try:
        async with asyncio.timeout(budget):
            if page is not None and spec.links:
                await found.from_page(*page)
            if spec.sitemap is not None:
                await found.from_sitemaps(required=page is None)
    except TimeoutError:
        if page is None and found.source is None:
            raise FetchTimeoutError(
                f"discovering URLs from {worker_input['url']} took longer than {budget:.3g}s",
                url=worker_input["url"],
            ) from None
        found.warn(
            "discover_deadline",
            f"the step's deadline ended discovery after {len(found.urls)} URL(s)",
            incomplete=True,
        )
    return found.finish(), found
