"""Tenants on the activity side: the registry held against every call.

A pipeline is checked once at its start (the ``run-config`` activity in
``activities/limits.py``); a call that does not come from a pipeline (a
worker request started by hand, ``aiworker conformance``, another workflow)
is checked here, in the runtime, for every attempt: one dictionary lookup.

- :func:`admit`: an unknown tenant, or a worker the tenant may not call, is
  ``invalid_input``; the tenant's entry comes back for the egress allow-list.
- :func:`check_redrive_tenant`: a redrive (``resume_from``) reuses the outputs
  and the idempotency keys of an earlier run, so that run must be the same
  tenant's; its tenant is read from the first event of its history, the
  pipeline input it started with.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.errors import InvalidInputError
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.protocol import WorkerRequest
from aiworker.schemas.tenants import TenantPolicy


def admit(settings: Settings, request: WorkerRequest) -> TenantPolicy | None:
    """The registry entry of the request's tenant (None without a registry).

    Raises:
        InvalidInputError: the registry does not know the tenant, or the
            tenant may not call the request's worker.
    """
    registry = settings.tenants
    if registry is None:
        return None
    policy = registry.policy(request.tenant)
    if policy is None:
        raise InvalidInputError(f"tenant {request.tenant!r} is not configured", field="tenant")
    if not policy.may_use(request.worker_id):
        raise InvalidInputError(
            f"tenant {request.tenant!r} may not call worker {request.worker_id!r}",
            field="worker_id",
        )
    return policy


async def check_redrive_tenant(client: Client, workflow_id: str, tenant: str) -> None:
    """Refuse a redrive of ``workflow_id`` unless that run was ``tenant``'s.

    Raises:
        InvalidInputError: the run is another tenant's, is not a pipeline, or
            cannot be found; the same message for each.
    """
    handle = client.get_workflow_handle(workflow_id)
    first: Any = None
    try:
        async for event in handle.fetch_history_events(page_size=1):
            first = event
            break
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
    started = first.workflow_execution_started_event_attributes if first is not None else None
    earlier: Any = None
    if started is not None and started.workflow_type.name == names.PIPELINE_WORKFLOW:
        decoded = await client.data_converter.decode(started.input.payloads)
        pipeline = decoded[0] if decoded else None
        if isinstance(pipeline, dict):
            earlier = pipeline.get("tenant", names.DEFAULT_TENANT)
    if earlier != tenant:
        # One message whether the run is missing, not a pipeline, or another
        # tenant's: which ids exist elsewhere is not this tenant's to learn.
        raise InvalidInputError(
            f"resume_from names {workflow_id!r}, which is not a pipeline run of tenant "
            f"{tenant!r}; a pipeline may only redrive its own tenant's runs",
            field="resume_from.workflow_id",
        )
