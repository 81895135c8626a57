"""Tools that workers reach through the toolbox: ``fetch_url``, ``parse_html``, ``render``.

Built once per process (:func:`scrape_tools`) and shared by every activity,
so robots.txt caches, politeness slots, breakers and connection pools are
per process, not per call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aiworker.activities.tools.autothrottle import AutoThrottle
from aiworker.config.extras import require

if TYPE_CHECKING:
    from aiworker.activities.bodies import BodyMeter
    from aiworker.activities.breakers import BreakerRegistry
    from aiworker.activities.metrics import WorkerMetrics
    from aiworker.activities.tools.browser import BrowserLimits, BrowserTool
    from aiworker.activities.tools.egress import EgressPolicy
    from aiworker.activities.tools.extract import HtmlParser
    from aiworker.activities.tools.fetch import FetchLimits, FetchResult, FetchTool
    from aiworker.activities.tools.robots import Politeness, RobotsCache
    from aiworker.config.settings import Settings

# Re-exported names, imported on first use: importing one tool module (the egress
# policy, which the runtime and publish use) must not load the HTML parser, whose
# packages come with the 'scrape' extra (aiworker.config.extras).
_LAZY = {
    "BrowserLimits": "browser",
    "BrowserTool": "browser",
    "EgressPolicy": "egress",
    "HtmlParser": "extract",
    "FetchLimits": "fetch",
    "FetchResult": "fetch",
    "FetchTool": "fetch",
    "Politeness": "robots",
    "RobotsCache": "robots",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def scrape_tools(
    settings: Settings,
    *,
    egress: EgressPolicy | None = None,
    limits: FetchLimits | None = None,
    politeness: Politeness | None = None,
    breakers: BreakerRegistry | None = None,
    robots: RobotsCache | None = None,
    metrics: WorkerMetrics | None = None,
    meter: BodyMeter | None = None,
) -> dict[str, Any]:
    """The ``fetch_url``, ``parse_html``, ``artifact_store`` and ``render`` tools for ``settings``.

    The keyword arguments replace a part (tests: an egress policy that trusts
    one loopback server, a breaker with a low threshold); ``metrics`` exports
    the host breakers' state as ``aiworker_breaker_state``; ``meter`` counts
    the bytes of every body the fetch tool reads. Needs the 'scrape' extra.
    """
    require("scrape", "the web-scrape tools")
    from aiworker.activities.artifacts import FileArtifactStore
    from aiworker.activities.breakers import BreakerRegistry
    from aiworker.activities.tools.browser import BrowserLimits, BrowserTool
    from aiworker.activities.tools.egress import EgressPolicy
    from aiworker.activities.tools.extract import HtmlParser
    from aiworker.activities.tools.fetch import FetchTool

    fetcher = FetchTool(
        egress or EgressPolicy.from_settings(settings),
        limits=limits,
        robots=robots,
        politeness=politeness if politeness is not None else politeness_for(settings),
        breakers=(
            breakers
            if breakers is not None
            else BreakerRegistry.from_settings("host", settings, metrics=metrics)
        ),
        meter=meter,
        max_connections=settings.fetch_max_connections,
        tenant_share=settings.fetch_tenant_share,
    )
    return {
        "fetch_url": fetcher,
        "parse_html": HtmlParser(max_json_depth=settings.caps.max_json_depth),
        "artifact_store": FileArtifactStore(settings.data_dir),
        # Launches Chromium only when a step asks for render: "browser".
        "render": BrowserTool(
            fetcher,
            settings.browser_executable,
            BrowserLimits(max_in_flight=settings.browser_max_in_flight),
        ),
    }


def politeness_for(settings: Settings) -> Politeness:
    """Per-host politeness as ``settings`` configure it, with this process's autothrottle."""
    from aiworker.activities.tools.robots import Politeness

    return Politeness(
        min_delay_seconds=settings.scrape_min_delay_seconds,
        throttle=AutoThrottle(
            target_concurrency=settings.autothrottle_target_concurrency,
            floor_seconds=settings.scrape_min_delay_seconds,
            ceiling_seconds=settings.scrape_max_delay_seconds,
            enabled=settings.autothrottle,
        ),
    )


__all__ = [
    "AutoThrottle",
    "BrowserLimits",
    "BrowserTool",
    "EgressPolicy",
    "FetchLimits",
    "FetchResult",
    "FetchTool",
    "HtmlParser",
    "Politeness",
    "RobotsCache",
    "politeness_for",
    "scrape_tools",
]
