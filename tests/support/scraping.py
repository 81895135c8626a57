"""A stack of every worker with the real scrape tools, closed after use."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from conftest import Stack, running_stack
from temporalio.client import Client

from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings


@contextlib.asynccontextmanager
async def scrape_stack(
    client: Client, settings: Settings, **tool_options: Any
) -> AsyncIterator[Stack]:
    """Workers for every queue with ``scrape_tools(settings, **tool_options)``; the
    browser (when one was launched) and the HTTP client are closed at the end."""
    tools = scrape_tools(settings, **tool_options)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            yield stack
    finally:
        await tools["render"].aclose()
        await tools["fetch_url"].aclose()
