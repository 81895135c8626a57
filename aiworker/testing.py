"""Test helpers for worker authors: run a worker without a Temporal server.

:func:`run_worker` sends one request through the same runtime the worker
process uses (envelope, input and output schemas, constraints, toolbox,
deadline, error mapping, the call's span and log line), outside any
activity. A success returns the :class:`~aiworker.WorkerResponse`; a failure
raises the
``temporalio.exceptions.ApplicationError`` the activity would fail with
(``type`` is the stable error code, ``details[0]`` the ``ErrorInfo``)::

    async def test_slugify() -> None:
        response = await run_worker(Slugify(), {"title": "Hello World"})
        assert response.outputs == {"slug": "hello-world"}

For a live worker behind Temporal, ``aiworker conformance WORKER_ID``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.sdk import Worker
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import RequestConstraints, WorkerResponse

__all__ = ["run_worker"]


async def run_worker(
    worker: Worker,
    input: dict[str, Any],  # noqa: A002 (public API: run_worker's documented parameter)
    *,
    tenant: str = "default",
    constraints: RequestConstraints | Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    tools: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
) -> WorkerResponse:
    """Run ``worker`` once on ``input`` as its activity would.

    Args:
        worker: the worker to run, under its own spec.
        input: the request's ``input``.
        tenant: the request's tenant.
        constraints: tightening overrides (``timeout_seconds``, ``max_tokens``, ...).
        idempotency_key: the request's key (a fresh one when omitted).
        tools: the tools the worker may reach (by tool name; none when omitted).
        settings: process settings (defaults when omitted).
    """
    runtime = WorkerRuntime(
        settings or Settings(), {worker.worker_id: worker.spec}, tools=tools or {}
    )
    request = {
        "worker_id": worker.worker_id,
        "version": worker.spec.version,
        "idempotency_key": idempotency_key or f"test/{uuid.uuid4().hex}",
        "tenant": tenant,
        "input": input,
        "constraints": (
            constraints.model_dump(mode="json", exclude_none=True)
            if isinstance(constraints, RequestConstraints)
            else dict(constraints or {})
        ),
    }
    # No Temporal worker, so no interceptor: open the call's telemetry (span,
    # log line) here, with the same code the interceptor runs.
    with observe_call(worker.worker_id):
        return await runtime.run(worker, request)
