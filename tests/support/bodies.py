"""Pieces the body tests share: a scrape stack whose fetch tool counts its body
bytes, and a loopback answer with any ``Content-Encoding`` header lines."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from aiworker.activities.bodies import BodyMeter
from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.tools import FetchLimits, scrape_tools
from aiworker.config.settings import Settings, parse_rate_limits
from support.loopback import Exchange
from support.payloads import stack_settings


def metered_scrape(
    tmp: Path, limits: FetchLimits | None = None
) -> tuple[Settings, dict[str, Any], BodyMeter]:
    """Settings without the spec's per-tenant rate limit (many cases run at once), the
    scrape tools with a host breaker that never opens, and the meter of their fetch tool."""
    settings = stack_settings(tmp, rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")))
    meter = BodyMeter()
    tools = scrape_tools(
        settings,
        limits=limits,
        breakers=BreakerRegistry("host", failure_threshold=10_000),
        meter=meter,
    )
    return settings, tools, meter


def send_encoded(ex: Exchange, body: bytes, ctype: str, codings: list[str]) -> None:
    """Answer 200 with ``body`` and one ``Content-Encoding`` line per item of ``codings``
    (``Exchange.send`` takes one value per header name)."""
    ex.raw.send_response(200)
    ex.raw.send_header("Content-Type", ctype)
    ex.raw.send_header("Content-Length", str(len(body)))
    for coding in codings:
        ex.raw.send_header("Content-Encoding", coding)
    ex.raw.end_headers()
    with contextlib.suppress(OSError):
        ex.raw.wfile.write(body)
