"""Tool instances for the worker runtime, built once per process from settings."""

from __future__ import annotations

from typing import Any

from activities.tools import scrape_tools
from schemas.settings import Settings


def build_tools(settings: Settings) -> dict[str, Any]:
    """Every tool this process can hand to workers, by tool name."""
    tools: dict[str, Any] = {}
    tools.update(scrape_tools(settings))  # fetch_url, parse_html, artifact_store
    return tools
