"""The Temporal Web UI explains a run, read in a real headless Chromium.

A dev server of its own with the Web UI on a free loopback port (as ``aiworker
dev`` starts it), a rate-limited pipeline whose steps wait for permits, then
the workflow's pages as a person opens them: the Event History and the
Timeline name each wait (what for, for which step and tenant), and User
Metadata → Current Details shows the step list with step ids and workers as
separate words. Each page is saved as a screenshot under the test's tmp dir
and the assertions read its rendered text (``inner_text``).

A pipeline that failed is listed as Failed in the UI's workflow list (its
row read from the list page, and saved as a screenshot).

Chromium is Debian's package (never downloaded); the test skips, naming the
package, when it is absent.
"""

from __future__ import annotations

import asyncio
import os
import re
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import running_stack
from support.payloads import stack_settings
from support.summaries import limited_pipeline, limited_rate
from support.waiting import wait_until
from temporalio.client import Client, WorkflowFailureError

from aiworker.config.settings import parse_rate_limits
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import DevServer, free_port

if TYPE_CHECKING:
    from playwright.async_api import Page

try:
    from playwright.async_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the tests that need it skip
    PlaywrightTimeout = TimeoutError  # type: ignore[misc,assignment]

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Chromium is not installed: apt-get install chromium (Debian's package)",
    ),
    pytest.mark.timeout(240),
]
# How long a page may take to show what it loads (the UI fetches after it renders).
PAGE_WAIT_MS = 30_000


def _ui_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@asynccontextmanager
async def dev_server_with_ui(tmp_path: Path) -> AsyncIterator[DevServer]:
    """A Temporal dev server with its Web UI, both on free loopback ports."""
    server = DevServer(tmp_path / "server", port=free_port(), ui_port=free_port(), persistent=False)
    await asyncio.to_thread(server.start)
    try:
        ui = server.ui_url
        assert ui is not None
        await wait_until(lambda: asyncio.to_thread(_ui_answers, ui), f"the Web UI at {ui}")
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def _open(page: Page, url: str, shows: str, shot: Path) -> str:
    """Open ``url``, wait (bounded) until ``shows`` is rendered, save a screenshot,
    and return the page's rendered text."""
    await page.goto(url)
    await page.get_by_text(shows, exact=False).first.wait_for(timeout=PAGE_WAIT_MS)
    await page.screenshot(path=str(shot), full_page=True)
    return await page.inner_text("body")


@asynccontextmanager
async def chromium_page() -> AsyncIterator[Page]:
    """A page of Debian's headless Chromium (1600x1200), closed with its browser."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            # Chromium refuses its sandbox as root (tests in containers run as root)
            chromium_sandbox=os.geteuid() != 0,
        )
        try:
            yield await browser.new_page(viewport={"width": 1600, "height": 1200})
        finally:
            await browser.close()


async def test_the_ui_names_each_wait_and_lists_the_steps(tmp_path: Path) -> None:
    pytest.importorskip("playwright.async_api", reason="playwright is not installed")

    tenant = f"t{uuid.uuid4().hex[:6]}"
    settings = stack_settings(tmp_path, rate_limits=tuple(parse_rate_limits(limited_rate(tenant))))
    async with dev_server_with_ui(tmp_path) as server:
        client = await Client.connect(server.address, data_converter=data_converter(None))
        # the workers stay up while the pages are read: current details are a query
        async with running_stack(client, settings) as stack:
            handle = await stack.start(limited_pipeline(tenant))
            result = await handle.result()
            assert result.status == "succeeded", result
            run_id = (await handle.describe()).run_id
            base = f"{server.ui_url}/namespaces/{client.namespace}/workflows/{handle.id}/{run_id}"
            wait = (
                f"wait for a validator permit (tenant {tenant}, limit 2 per 2s) for step summarize"
            )
            ask = f"ask for a validator permit (tenant {tenant}) for step summarize"
            async with chromium_page() as page:
                history = await _open(page, f"{base}/history", ask, tmp_path / "history.png")
                timeline = await _open(page, f"{base}/timeline", wait, tmp_path / "timeline.png")
                # a local activity's row shows its type; a click opens its summary
                await page.get_by_role("button", name="Event limiter-acquire").first.click()
                await page.get_by_text("ask for a concurrency slot of c1").first.wait_for(
                    timeout=PAGE_WAIT_MS
                )
                await page.screenshot(path=str(tmp_path / "clicked.png"), full_page=True)
                await page.goto(f"{base}/user-metadata")
                details = page.frame_locator("iframe#user-metadata-current-details")
                await details.get_by_text("steps done").wait_for(timeout=PAGE_WAIT_MS)
                await page.screenshot(path=str(tmp_path / "details.png"), full_page=True)
                metadata = await page.inner_text("body")
                steps = await details.locator("body").inner_text()
    for shot in ("history.png", "timeline.png", "details.png"):
        assert (tmp_path / shot).stat().st_size > 0
    # Event History: each local activity and timer row shows its summary
    assert ask in history
    assert wait in history
    assert "ask for a concurrency slot of c1 (limit 1 at once) for the pipeline" in history
    # Timeline: the timers by what they wait for, not by number and duration ("1 (1m, 59s)")
    assert wait in timeline
    assert (
        f"wait for a validator permit (tenant {tenant}, limit 2 per 2s) for step read" in timeline
    )
    assert "each items 0..2 (validator)" in timeline  # the for_each chunk child
    assert not re.search(r"^\d+ \(\d+m, \d+s\)$", timeline, re.M), timeline
    # User Metadata → Current Details: one line per step, id and worker apart
    assert "User Metadata" in metadata and "Current Details" in metadata
    lines = [line.strip() for line in steps.splitlines() if line.strip()]
    assert "explained · succeeded · 3 of 3 steps done" in lines, lines
    assert "read · validator · succeeded · 1 attempt" in lines, lines
    assert "summarize · validator · succeeded · 1 attempt" in lines, lines
    assert "each · validator · succeeded · 1 attempt · items 3 of 3" in lines, lines


async def test_the_ui_lists_a_failed_pipeline_as_failed(tmp_path: Path) -> None:
    pytest.importorskip("playwright.async_api", reason="playwright is not installed")
    from support.standins import fail, standin

    async def unavailable(request: dict[str, object]) -> dict[str, object]:
        raise fail("fetch_failed", "GET https://shop.example/list: 503 Service Unavailable")

    settings = stack_settings(tmp_path)
    pipeline = {
        "name": "ui-failed",
        "steps": [
            {
                "id": "products",
                "worker": "web-scrape",
                "input": {
                    "url": "https://shop.example/list",
                    "extraction_spec": {"fields": {"title": {"selector": "h1"}}},
                },
            }
        ],
    }
    acts = {"web-scrape": standin("web-scrape", unavailable)}
    async with dev_server_with_ui(tmp_path) as server:
        client = await Client.connect(server.address, data_converter=data_converter(None))
        async with running_stack(client, settings, replace_activities=acts) as stack:
            handle = await stack.start(pipeline)
            with pytest.raises(WorkflowFailureError):
                await handle.result()
        lists = f"{server.ui_url}/namespaces/{client.namespace}/workflows"
        async with chromium_page() as page:
            query = urllib.parse.quote(f'WorkflowId="{handle.id}"')
            listed = f"{lists}?query={query}"
            await page.goto(listed)
            row = page.locator("tr", has_text=handle.id).first
            # visibility is eventual: reload (bounded) until the row shows it ended
            for _ in range(20):
                try:
                    await row.get_by_text("Failed", exact=True).wait_for(timeout=3_000)
                    break
                except PlaywrightTimeout:
                    await page.reload()
            # the row itself: a page screenshot of the list comes out blank here
            await row.screenshot(path=str(tmp_path / "row.png"))
            text = await row.inner_text()
            badge = await row.get_by_text("Failed", exact=True).all_text_contents()
    assert (tmp_path / "row.png").stat().st_size > 0
    # the status badge says Failed (the UI renders it in capitals)
    assert badge == ["Failed"], (badge, text)
    assert "FAILED" in text.upper().split(), text
    assert "COMPLETED" not in text.upper(), text
