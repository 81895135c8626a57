"""The ``render`` tool: a page loaded in headless Chromium, every request through ``fetch_url``.

web-scrape's ``render: "browser"`` fetches the page itself with the guarded
fetcher (:class:`~aiworker.activities.tools.fetch.FetchTool`: egress after DNS,
robots.txt, breaker, politeness, redirects, body cap), then loads it in
Chromium, driven by Playwright's Python package pointed at Debian's
``chromium`` (nothing downloads a browser at run time). Chromium itself never
talks to the network:

- every request of the page (scripts, styles, images, XHR, frames) is
  intercepted and answered through the fetcher, or refused and counted by
  reason (``activities/tools/browser_gate.py``), at most
  :attr:`BrowserLimits.max_in_flight` of them out at once so that one page
  cannot hold the process's fetch pool; WebSockets are closed before they
  connect, service workers are blocked;
- the browser's proxy is a local sinkhole that answers nothing: whatever
  escapes interception fails there and is recorded in
  :attr:`BrowserTool.escaped`, so a leak shows up instead of reaching a host.
  Chromium 156 still tries update.googleapis.com and accounts.google.com at
  start, whatever the flags; those attempts end there;
- Chromium's own background traffic is off (:data:`CHROMIUM_ARGS`).

A hostile page cannot outlive its call. Every call into the browser (launch,
context, routes, ``goto``, the waits, ``content``) ends by the render's
deadline less ``close_seconds`` (one ``asyncio`` timeout over them, not one
per call); closing the context has ``close_seconds``, and a close that does
not return in time (Playwright's close waits for a renderer that may be
spinning in script) SIGKILLs the browser's whole process tree by PID: the
next call launches a new browser. Chromium has no per-call kill switch that
works on a busy renderer and Temporal's cancellation cannot reach a child
process, hence this mechanism of our own. Each renderer's JavaScript heap is
capped (V8's ``--max-old-space-size``, :attr:`BrowserLimits.max_heap_mb`): a
page over it crashes its own renderer (``fetch_failed``, ``renderer_crashed``),
not the browser; and each renderer's data segment (``RLIMIT_DATA``,
:attr:`BrowserLimits.max_renderer_mb`): ArrayBuffers past it fail to allocate.
A missed deadline is ``fetch_timeout`` (``reason: render_deadline``).

One browser per process, launched on first use with Playwright's fresh
temporary profile (removed when the browser closes); each call gets a new
context, closed after. A browser that dies is noticed (``disconnected``):
the call fails ``fetch_failed`` (retryable, ``reason: browser_crashed``) and
the next call launches a new one. A missing executable is ``tool_not_allowed``
(not retryable) naming the package to install.

Playwright's driver and its tasks outlive the call that launched them, so
they start in an empty context: no call's context (its tenant's egress list)
leaks into another call's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import resource
import signal
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiworker.activities.errors import FetchFailedError, FetchTimeoutError, ToolNotAllowedError
from aiworker.activities.tools.browser_gate import PageCall, Sinkhole, dispatch, refuse_websocket
from aiworker.activities.tools.fetch import FetchResult, FetchTool

CHROMIUM_PACKAGE = "chromium"
# What closing the browser and stopping Playwright's driver may take (relaunch, shutdown).
_SHUTDOWN_SECONDS = 5.0
INSTALL_HINT = "apt-get install chromium"

# Playwright 1.65 passes its own --disable-features list; Chromium reads only the
# last such switch, so ours repeats Playwright's and adds the background services.
_PLAYWRIGHT_DISABLED = (
    "AvoidUnnecessaryBeforeUnloadCheckSync,DestroyProfileOnBrowserClose,HttpsUpgrades,"
    "HttpsFirstBalancedModeAutoEnable,LensOverlay,MediaRouter,PaintHolding,"
    "ThirdPartyStoragePartitioning,AvoidCorsURLLoaderRestartOnRedirect,TcpPortRandomizationWin,"
    "OptimizationHints,NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch"
)
_BACKGROUND_DISABLED = (
    "SafeBrowsingEnhancedProtection,SafeBrowsingEnterpriseRealTimeUrlCheck,"
    "OptimizationGuideModelDownloading,OptimizationHintsFetching,OptimizationTargetPrediction,"
    "Translate,TranslateUI,DialMediaRouteProvider,CertificateTransparencyComponentUpdater,"
    "AutofillServerCommunication,InterestFeedContentSuggestions,NetworkPrediction,"
    "SpeculationRulesPrefetchFuture"
)
# Background traffic off. Playwright already adds most of these; they are
# repeated so that the list here is the whole contract, whatever its version.
CHROMIUM_ARGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--metrics-recording-only",
    "--disable-field-trial-config",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--safebrowsing-disable-auto-update",
    "--disable-breakpad",
    "--no-pings",
    "--dns-prefetch-disable",
    "--disable-quic",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--force-webrtc-ip-handling-policy",
    f"--disable-features={_PLAYWRIGHT_DISABLED},{_BACKGROUND_DISABLED}",
)


@dataclass(frozen=True)
class BrowserLimits:
    """Bounds of one rendered page.

    Attributes:
        max_requests: requests one page may make (its document included); later
            ones are blocked (``quota``): the render tool's own quota.
        max_total_bytes: bytes of all its sub-resources together (each is also
            under the fetch tool's per-body cap).
        max_in_flight: its requests out at once (a browser's six per host, here
            for the whole page); the rest wait their turn, so one page cannot
            take the process's fetch pool.
        max_pages: pages one process renders at once (Chromium is heavy).
        reserve_seconds: time kept back from the wait for reading the DOM.
        close_seconds: time kept back at the end of the call for closing the page's
            context; a close that takes longer kills the browser.
        max_heap_mb: the JavaScript heap ceiling of each renderer (V8's
            ``--max-old-space-size``); a page over it crashes its renderer.
        max_renderer_mb: the data segment of each process Chromium's zygote starts
            (renderers): ``RLIMIT_DATA`` set on the zygotes after launch, inherited
            by every renderer; ArrayBuffers and DOM past it fail to allocate.
    """

    max_requests: int = 200
    max_total_bytes: int = 32 * 1024 * 1024
    max_in_flight: int = 6
    max_pages: int = 2
    reserve_seconds: float = 0.5
    close_seconds: float = 1.0
    max_heap_mb: int = 512
    max_renderer_mb: int = 1024


@dataclass
class RenderResult:
    """A rendered page: the fetched document, the DOM after scripts ran, and what happened."""

    page: FetchResult
    html: str
    waited: bool
    requests: list[dict[str, str]] = field(default_factory=list)
    blocked: Counter[str] = field(default_factory=Counter)
    seen: int = 0
    fetched: int = 0

    def summary(self) -> dict[str, Any]:
        """The ``source.browser`` block of the web-scrape output."""
        return {
            "requests": self.seen,
            "fetched": self.fetched,
            "blocked": dict(sorted(self.blocked.items())),
        }


class BrowserTool:
    """The ``render`` tool; one instance per process, one browser behind it.

    Args:
        fetcher: the process's ``fetch_url`` tool; every request goes through it.
        executable: the Chromium binary (Debian's ``chromium`` package).
        limits: bounds of one page.
    """

    def __init__(
        self,
        fetcher: FetchTool,
        executable: Path | str = "/usr/bin/chromium",
        limits: BrowserLimits | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.executable = Path(executable)
        self.limits = limits or BrowserLimits()
        self.launches = 0
        self.kills = 0
        self._browser_pid: int | None = None
        self._broken = False
        self._pages = asyncio.Semaphore(self.limits.max_pages)
        self._lock = asyncio.Lock()
        self._playwright: Any = None
        self._browser: Any = None
        self._sinkhole = Sinkhole()

    @property
    def proxy(self) -> str | None:
        """The sinkhole proxy the running browser was given (it names that browser)."""
        return self._sinkhole.url

    @property
    def escaped(self) -> list[str]:
        """First lines of connections that reached the sinkhole proxy (should be none)."""
        return list(self._sinkhole.seen)

    def check_installed(self) -> None:
        """``tool_not_allowed`` naming the package when Chromium is not installed."""
        if not (self.executable.is_file() and os.access(self.executable, os.X_OK)):
            raise ToolNotAllowedError(
                f"the render tool needs Chromium, and {self.executable} is not an executable "
                f"file: install Debian's {CHROMIUM_PACKAGE!r} package ({INSTALL_HINT}) or set "
                "AIWORKER_BROWSER_EXECUTABLE",
                tool="render",
                package=CHROMIUM_PACKAGE,
                executable=str(self.executable),
            )

    async def _browser_ready(self, deadline: float) -> Any:
        async with self._lock:
            if self._browser is None or self._broken or not self._browser.is_connected():
                await self._shutdown()
                # Started in an empty context: the driver's tasks outlive this call.
                task = asyncio.create_task(self._launch(deadline), context=contextvars.Context())
                self._browser = await task
            return self._browser

    async def _launch(self, deadline: float) -> Any:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout
        from playwright.async_api import async_playwright

        self.check_installed()
        proxy = await self._sinkhole.start()
        self._playwright = await async_playwright().start()
        try:
            browser = await self._playwright.chromium.launch(
                executable_path=str(self.executable),
                headless=True,
                args=[*CHROMIUM_ARGS, f"--js-flags=--max-old-space-size={self.limits.max_heap_mb}"],
                # Chromium refuses its sandbox as root; tests and the dev image run as root.
                chromium_sandbox=os.geteuid() != 0,
                proxy={"server": proxy},
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
                # Playwright kills a browser that does not start in time.
                timeout=_ms(deadline - time.monotonic()),
            )
        except PlaywrightTimeout:
            await self._shutdown()
            raise FetchTimeoutError(
                f"Chromium ({self.executable}) did not start before the render's deadline",
                reason="browser_start",
            ) from None
        except PlaywrightError as e:
            await self._shutdown()
            raise ToolNotAllowedError(
                f"could not start Chromium ({self.executable}): {str(e.message).splitlines()[0]}",
                tool="render",
                package=CHROMIUM_PACKAGE,
            ) from None
        self.launches += 1
        self._browser_pid = _browser_pid(proxy)
        self._broken = False
        if self._browser_pid is not None:
            _limit_renderers(self._browser_pid, self.limits.max_renderer_mb << 20)
        return browser

    async def _shutdown(self) -> None:
        browser, pw = self._browser, self._playwright
        self._browser = self._playwright = None
        # Bounded: a browser whose renderer spins may never answer a close.
        if browser is not None:
            try:
                async with asyncio.timeout(_SHUTDOWN_SECONDS):
                    await browser.close()
            except TimeoutError:
                self._browser = browser
                self._kill(browser)
                self._browser = None
            except Exception:  # closing a dead browser
                pass
        self._browser_pid = None
        if pw is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_SHUTDOWN_SECONDS):
                    await pw.stop()
        await self._sinkhole.close()

    async def aclose(self) -> None:
        """Close the browser and its driver (at process shutdown)."""
        async with self._lock:
            await self._shutdown()

    async def render(
        self,
        url: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the whole call's budget, wait included
        wait_for: str | None = None,
        user_agent: str | None = None,
        respect_robots: bool = True,
        allow_domains: Iterable[str] | None = None,
    ) -> RenderResult:
        """Fetch ``url``, load it in Chromium, wait for ``wait_for``, return the DOM.

        ``wait_for`` is a CSS selector or ``"networkidle"``; the page's ``load``
        event when None. A wait that does not end within ``timeout`` returns the
        DOM as it is with ``waited=False``; a page that keeps the browser busy
        past it (no DOM to read) is ``fetch_timeout`` (``reason:
        render_deadline``), its renderer stopped.
        """
        self.check_installed()
        deadline = time.monotonic() + timeout
        document = await self.fetcher.fetch(
            url,
            timeout=timeout,
            user_agent=user_agent,
            respect_robots=respect_robots,
            allow_domains=allow_domains,
        )
        call = PageCall(
            fetcher=self.fetcher,
            max_requests=self.limits.max_requests,
            max_total_bytes=self.limits.max_total_bytes,
            in_flight=asyncio.Semaphore(self.limits.max_in_flight),
            document=document,
            deadline=deadline,
            user_agent=user_agent,
            respect_robots=respect_robots,
            allow_domains=tuple(allow_domains or ()),
            context=contextvars.copy_context(),
        )
        # A page slot, the browser and the page all within the deadline; a slot
        # that does not free up in time (two hostile pages) is a timeout too, and
        # nothing is asked of the browser without time left for it.
        no_time = FetchTimeoutError(
            f"no time was left to render {url} (fetching it, or waiting for one of the "
            f"{self.limits.max_pages} browser pages of this process)",
            url=url,
            reason="render_deadline",
        )
        try:
            async with asyncio.timeout(deadline - time.monotonic() - self.limits.close_seconds):
                await self._pages.acquire()
        except TimeoutError:
            raise no_time from None
        try:
            if deadline - time.monotonic() <= self.limits.close_seconds:
                raise no_time
            browser = await self._browser_ready(deadline)
            html, waited = await self._load(browser, call, wait_for)
        finally:
            self._pages.release()
        return RenderResult(
            document, html, waited, call.requests, call.blocked, call.seen, call.fetched
        )

    async def _load(self, browser: Any, call: PageCall, wait_for: str | None) -> tuple[str, bool]:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        url = call.document.final_url
        loop = asyncio.get_running_loop()
        # Every call into the browser ends by `work_end`; closing the context has
        # the rest of the call's time (close_seconds).
        work_end = loop.time() + (call.deadline - time.monotonic()) - self.limits.close_seconds
        context = None
        crashed: list[bool] = []
        missed = False
        try:
            async with asyncio.timeout_at(work_end):
                context = await browser.new_context(
                    service_workers="block",
                    accept_downloads=False,
                    user_agent=call.user_agent or self.fetcher.user_agent,
                )
                await context.route("**/*", lambda route, _request: dispatch(route, call))
                await context.route_web_socket("**/*", refuse_websocket)
                page = await context.new_page()
                page.once("crash", lambda _page: crashed.append(True))
                budget = work_end - loop.time() - self.limits.reserve_seconds
                try:
                    await page.goto(url, wait_until="domcontentloaded", timeout=_ms(budget))
                except PlaywrightTimeout:
                    missed = True
                    raise FetchTimeoutError(
                        f"loading {url} in the browser timed out", url=url
                    ) from None
                waited = True
                try:
                    budget = work_end - loop.time() - self.limits.reserve_seconds
                    if wait_for is None:
                        await page.wait_for_load_state("load", timeout=_ms(budget))
                    elif wait_for == "networkidle":
                        await page.wait_for_load_state("networkidle", timeout=_ms(budget))
                    else:
                        await page.wait_for_selector(
                            wait_for, state="attached", timeout=_ms(budget)
                        )
                except PlaywrightTimeout:
                    waited = False
                html: str = await page.content()
                return html, waited
        except TimeoutError:
            missed = True
            raise FetchTimeoutError(
                f"the page {url} kept the browser busy past the render's deadline "
                f"({self.limits.close_seconds:g} s kept for closing); its renderer was stopped",
                url=url,
                reason="render_deadline",
            ) from None
        except PlaywrightError as e:
            if crashed:
                raise FetchFailedError(
                    f"the page {url} crashed its renderer (a page over the browser's memory "
                    f"ceiling of {self.limits.max_heap_mb} MB ends this way)",
                    url=url,
                    reason="renderer_crashed",
                ) from None
            if await _gone(browser):
                raise FetchFailedError(
                    f"the browser exited while loading {url}", url=url, reason="browser_crashed"
                ) from None
            raise FetchFailedError(
                f"the browser could not load {url}: {str(e.message).splitlines()[0]}",
                url=url,
                reason="browser_error",
            ) from None
        finally:
            # Requests still out end with the call, not with their own deadlines.
            for task in call.tasks:
                task.cancel()
            if missed or context is not None:
                await self._close(browser, context, missed)

    async def _close(self, browser: Any, context: Any, missed: bool) -> None:
        """Close a render's context within ``close_seconds``, or kill the browser.

        Playwright's ``close`` waits for the renderer; a renderer spinning in
        script never answers, so a close that does not return in time (and a
        context that was never made because the browser did not answer) ends
        with the browser's process tree killed by PID: the next call launches
        a new browser.
        """
        if context is not None:
            try:
                async with asyncio.timeout(self.limits.close_seconds):
                    await context.close()
                return
            except TimeoutError:
                pass
            except Exception:  # a browser already gone closes nothing
                return
        elif not missed:
            return
        self._kill(browser)

    def _kill(self, browser: Any) -> None:
        """SIGKILL ``browser``'s process tree (it is relaunched on the next call)."""
        if browser is not self._browser or self._browser_pid is None:
            return
        self._broken = True
        pids = _descendants(self._browser_pid)
        for pid in [self._browser_pid, *pids]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.kills += 1


async def _gone(browser: Any) -> bool:
    """Whether ``browser`` died: a killed browser fails the page's calls a moment
    before Playwright reports the disconnection."""
    for _ in range(20):
        if not browser.is_connected():
            return True
        await asyncio.sleep(0.05)
    return False


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(b")", 1)[1].split()[1])
    return parents


def _descendants(root: int) -> list[int]:
    """Processes under ``root`` (read from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _browser_pid(proxy: str) -> int | None:
    """The browser process under this one that was given ``proxy`` (not a renderer)."""
    mark = f"--proxy-server={proxy}".encode()
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if mark in cmd and not any(a.startswith(b"--type=") for a in cmd):
            return pid
    return None


def _limit_renderers(browser_pid: int, data_bytes: int) -> None:
    """``RLIMIT_DATA`` on the browser's zygotes: the renderers they fork inherit it.

    Chromium has no flag for a renderer's memory besides V8's heap; a data limit
    also bounds ArrayBuffers, images and the DOM. V8's and PartitionAlloc's
    address-space reservations are ``PROT_NONE`` and do not count against it.
    """
    for pid in _descendants(browser_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--type=zygote" not in f.read():
                    continue
            resource.prlimit(pid, resource.RLIMIT_DATA, (data_bytes, data_bytes))
        except (OSError, ValueError):
            continue  # a sandboxed zygote we may not change keeps V8's heap cap only


def _ms(seconds: float) -> float:
    return max(1.0, seconds * 1000)
