"""A for_each with ``items_per_task``: several items per activity task, each its own.

Through the real path: a pipeline on a dev server, the web-scrape worker, a
loopback site. Items go five to a ``web-scrape.items`` task; each keeps its own
result, attempts and error code, its own retries (in a next task round), its
own budget admission and rate permit.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Any

from conftest import running_stack
from support.history import grant_times
from support.loopback import Exchange, Loopback
from support.pipelines import pipeline_result
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas import names
from aiworker.schemas.batch import items_activity
from aiworker.schemas.pipeline import ChunkResult

PER_TASK = 5
ITEMS = 23
BAD = {3, 17}  # an invalid selector: invalid_input, never retried
FLAKY = {6, 7}  # the site answers 500 to their first request: retried once, then fine


def fast(settings: Settings, rate: str = "100000/min") -> Settings:
    """``settings`` with web-scrape's rate limit at ``rate`` (the tests' default is tight)."""
    return settings.model_copy(
        update={"rate_limits": tuple(parse_rate_limits(f"{names.WEB_SCRAPE}:*={rate}"))}
    )


class _Site:
    """Pages ``/p/<n>``; the paths in ``flaky`` fail their first request. Counts
    every request and when it arrived."""

    def __init__(self, flaky: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.lock = threading.Lock()
        self.flaky = {f"/p/{n}" for n in flaky}
        self.hits: Counter[str] = Counter()
        self.times: list[float] = []

    def handle(self, ex: Exchange) -> None:
        with self.lock:
            self.hits[ex.path] += 1
            self.times.append(time.monotonic())
            first = self.hits[ex.path] == 1
        if ex.path in self.flaky and first:
            return ex.send(500, b"down", None)
        ex.send(200, f"<html><body><h1>page {ex.path}</h1></body></html>".encode())


def pipeline(server: Loopback, items: list[dict[str, Any]], **step: Any) -> dict[str, Any]:
    return {
        "name": "items-per-task",
        "tenant": "acme",
        "inputs": {"items": items},
        "steps": [
            {
                "id": "pages",
                "worker": names.WEB_SCRAPE,
                "for_each": "${{ inputs.items }}",
                "items_per_task": step.pop("items_per_task", PER_TASK),
                "max_parallel": 10,
                "input": {
                    "url": server.url("/p/") + "${{ item.p }}",
                    "extraction_spec": {"fields": {"h1": {"selector": "${{ item.sel }}"}}},
                    "respect_robots": False,
                },
                **step,
            }
        ],
        **({"budget": step.pop("budget")} if "budget" in step else {}),
    }


async def chunks(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


async def scheduled(client: Client, workflow_id: str) -> Counter[str]:
    """The activities a workflow scheduled, by type."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return Counter(
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    )


async def test_items_per_task_keeps_each_items_result_attempts_and_code(
    client: Client, settings: Settings
) -> None:
    site = _Site(FLAKY)
    server = Loopback(site.handle).start()
    tools = scrape_tools(settings)
    items = [{"p": n, "sel": "h1[" if n in BAD else "h1"} for n in range(ITEMS)]
    try:
        async with running_stack(client, fast(settings), tools=tools) as stack:
            handle = await stack.start(pipeline(server, items))
            result = await handle.result()
            [chunk] = await chunks(client, handle.id)
            ended = await client.get_workflow_handle(chunk, result_type=ChunkResult).result()
            kinds = await scheduled(client, chunk)
    finally:
        server.stop()
        await tools["fetch_url"].aclose()

    pages = result.steps["pages"]
    assert pages.items == {"total": ITEMS, "succeeded": ITEMS - len(BAD), "failed": len(BAD)}
    by_index = {r.index: r for r in ended.items}
    assert sorted(by_index) == list(range(ITEMS))
    for n, r in by_index.items():
        if n in BAD:
            assert (r.status, r.error_code, r.attempts) == ("failed", "invalid_input", 1), r
            assert "selector" in (r.error_message or "") or "h1[" in (r.error_message or ""), r
        elif n in FLAKY:
            assert (r.status, r.attempts, r.error_code) == ("succeeded", 2, None), r
            assert r.outputs["data"]["h1"] == f"page /p/{n}", r
        else:
            assert (r.status, r.attempts, r.error_code) == ("succeeded", 1, None), r
            assert r.outputs["data"]["h1"] == f"page /p/{n}", r
    # every good page once, the flaky ones twice, the invalid ones never fetched
    assert site.hits == Counter(
        {f"/p/{n}": 2 if n in FLAKY else 1 for n in range(ITEMS) if n not in BAD}
    )
    # one task per five items, plus one retry round (both flaky items are in one group)
    rounds = 1
    assert kinds == {items_activity(names.WEB_SCRAPE): math.ceil(ITEMS / PER_TASK) + rounds}


async def test_items_per_task_budget_stops_items_exactly(
    client: Client, settings: Settings
) -> None:
    site = _Site()
    server = Loopback(site.handle).start()
    tools = scrape_tools(settings)
    items = [{"p": n, "sel": "h1"} for n in range(12)]
    try:
        async with running_stack(client, fast(settings), tools=tools) as stack:
            spec = pipeline(server, items)
            spec["budget"] = {"max_external_calls": 7}
            handle = await stack.start(spec)
            result = await pipeline_result(handle)
            [chunk] = await chunks(client, handle.id)
            kinds = await scheduled(client, chunk)
    finally:
        server.stop()
        await tools["fetch_url"].aclose()
    pages = result.steps["pages"]
    assert sum(site.hits.values()) == 7, site.hits
    assert result.usage.external_calls == 7
    assert pages.items == {"total": 12, "succeeded": 7, "failed": 5}
    assert {e["error_code"] for e in pages.outputs["errors"]} == {"budget_exceeded"}
    assert result.status == "budget_exhausted"
    # the admitted items went five to a task (5 + 2); the refused ones in none
    assert kinds == {items_activity(names.WEB_SCRAPE): 2}


async def test_items_per_task_rate_limit_holds_per_item(client: Client, settings: Settings) -> None:
    """A limit of 4 a second: every item takes its own permit (ten permits for two
    tasks), never more than 4 granted in any second, and a task starts only once
    every item it carries holds its permit."""
    site = _Site()
    server = Loopback(site.handle).start()
    tools = scrape_tools(settings)
    items = [{"p": n, "sel": "h1"} for n in range(10)]
    try:
        async with running_stack(client, fast(settings, "4/s"), tools=tools) as stack:
            handle = await stack.start(pipeline(server, items))
            result = await handle.result()
            [chunk] = await chunks(client, handle.id)
            history = await client.get_workflow_handle(chunk).fetch_history()
    finally:
        server.stop()
        await tools["fetch_url"].aclose()
    assert result.steps["pages"].items == {"total": 10, "succeeded": 10, "failed": 0}
    pooled, queued = grant_times(history)
    granted = sorted(pooled + queued)
    assert len(granted) == 10, granted
    for i in range(len(granted) - 4):  # never more than 4 grants in a second
        assert granted[i + 4] - granted[i] >= 1.0, granted
    # each task scheduled after the permits of all its items: the 5th and the 10th
    starts = [
        e.event_time.ToMicroseconds() / 1e6
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == items_activity(names.WEB_SCRAPE)
    ]
    assert len(starts) == 2 and len(site.hits) == 10
    assert starts[1] >= granted[-1] - 0.001 and starts[0] >= granted[4] - 0.001, (
        starts,
        granted,
    )


def test_items_per_task_needs_a_for_each_and_a_python_or_prompt_worker() -> None:
    from aiworker.config import catalog
    from aiworker.schemas.pipeline import PipelineSpec
    from aiworker.schemas.pipeline_check import check_pipeline

    def problems(step: dict[str, Any]) -> list[str]:
        spec = PipelineSpec.model_validate(
            {"name": "p", "steps": [{"id": "s", "input": {}, **step}]}
        )
        return [
            p.message
            for p in check_pipeline(spec, catalog.current_specs())
            if p.at == "items_per_task"
        ]

    assert problems({"worker": names.WEB_SCRAPE, "items_per_task": 5}) == [
        "only a for_each step takes items_per_task"
    ]
    [agent] = problems({"worker": names.LLM_AGENT, "for_each": [1], "items_per_task": 5})
    assert "python or prompt worker" in agent
    assert problems({"worker": names.WEB_SCRAPE, "for_each": [1], "items_per_task": 5}) == []
