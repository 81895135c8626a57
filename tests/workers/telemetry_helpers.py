"""Shared pieces of the telemetry tests: a process-wide in-memory span exporter,
a client with aiworker's telemetry, and a same-name ``validator`` stand-in
that fails its first attempt with a retryable code.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.errors import UpstreamError
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.protocol import WorkerResponse
from aiworker.workers.client.temporal_client import connect
from aiworker.workers.process.telemetry import Telemetry, install_tracer_provider

SPANS = InMemorySpanExporter()
_provider: TracerProvider | None = None


def span_provider() -> TracerProvider:
    """The process's SDK tracer provider, recording every span into ``SPANS``.

    OpenTelemetry allows one global provider per process, so every test
    module shares this one and tells its spans apart by trace id.
    """
    global _provider
    if _provider is None:
        provider = TracerProvider()
        installed = install_tracer_provider(provider)
        if not isinstance(installed, TracerProvider):
            raise RuntimeError("the global tracer provider is not the OpenTelemetry SDK's")
        installed.add_span_processor(SimpleSpanProcessor(SPANS))
        _provider = installed
    return _provider


async def telemetry_client(env: WorkflowEnvironment, telemetry: Telemetry) -> Client:
    """A client to the session's dev server with aiworker's telemetry wired in."""
    return await connect(
        target_host=env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        telemetry=telemetry,
    )


def new_telemetry() -> Telemetry:
    return Telemetry(environ={}, tracer_provider=span_provider(), drain_interval=0.2)


class FlakyValidator:
    """Fails attempt 1 with a retryable ``upstream_error``; passes from attempt 2.

    With ``leak`` set, it also logs and fails with that value (a stand-in for a
    configured API key that a careless message would quote).
    """

    worker_id: ClassVar[str] = names.VALIDATOR

    def __init__(self, leak: str | None = None) -> None:
        self.leak = leak

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        with ctx.span("upstream call", target="models.example") as span:
            span.set_attribute("aiworker.http_status", 503 if ctx.attempt == 1 else 200)
        if ctx.attempt == 1:
            if self.leak:
                activity.logger.info("calling upstream with Authorization: Bearer %s", self.leak)
                logging.getLogger("aiworker.test").warning("key in use: %s", self.leak)
                raise UpstreamError(
                    f"upstream refused key {self.leak}",
                    retry_after=0.05,
                    url=f"https://models.example/v1?key={self.leak}",
                )
            raise UpstreamError("upstream answered 503", retry_after=0.05, status_code=503)
        return WorkerResult(outputs={"valid": True, "errors": []})


class FlakyActivities:
    """The stand-in, run through the real worker runtime under the real name."""

    def __init__(self, runtime: WorkerRuntime, worker: FlakyValidator) -> None:
        self._runtime = runtime
        self._worker = worker

    @activity.defn(name=names.VALIDATOR)
    async def validator(self, request: dict[str, Any]) -> WorkerResponse:
        return await self._runtime.run(self._worker, request)


def flaky_validator(settings: Settings, leak: str | None = None) -> Any:
    runtime = WorkerRuntime(settings, load_specs(), metrics=WorkerMetrics(CollectorRegistry()))
    return FlakyActivities(runtime, FlakyValidator(leak)).validator


def workflow_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def hex_trace(span: Any) -> str:
    return format(span.context.trace_id, "032x")


# Fixtures shared by the telemetry and metrics tests (imported by them by name).


@pytest_asyncio.fixture(scope="module")
async def telemetry() -> AsyncIterator[Telemetry]:
    t = new_telemetry().start()
    try:
        yield t
    finally:
        t.shutdown()


@pytest_asyncio.fixture
async def tclient(env: WorkflowEnvironment, telemetry: Telemetry) -> Client:
    return await telemetry_client(env, telemetry)
