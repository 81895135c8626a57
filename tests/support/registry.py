"""The live registry as tests drive it: a process entry serving the built-in
validator (and more specs), and a raw publish (update-with-start) of any entry,
malformed ones included, signed with the test's registry secret unless told
otherwise (as a script that is not an aiworker process would publish)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.live_registry import (
    OWNER_FIELD,
    ProcessEntry,
    PublishRequest,
    RegistryState,
    sign_entry,
)
from aiworker.workers.process.live_registry import process_entry
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow


def entry(identity: str, *, specs: dict[str, Any] | None = None, **kw: Any) -> ProcessEntry:
    """A process entry serving the built-in validator (and ``specs``)."""
    from aiworker.schemas.spec import WorkerSpec

    all_specs = {names.VALIDATOR: load_specs()[names.VALIDATOR]}
    for wid, raw in (specs or {}).items():
        all_specs[wid] = WorkerSpec.model_validate(raw)
    return process_entry(
        identity=identity,
        build_id=kw.pop("build_id", "b1"),
        task_queues=["aiworker-pipelines-x"],
        specs=all_specs,
        served=set(all_specs),
        **kw,
    )


def signed(raw: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``raw`` signed with the registry secret of ``settings``."""
    secret = settings.registry_secret
    return sign_entry(raw, secret.get_secret_value().encode() if secret else None)


async def publish_raw(
    client: Client,
    settings: Settings,
    identity: str,
    raw: dict[str, Any],
    ttl: float = 60,
    *,
    sign: bool = True,
    owner: str | None = None,
) -> int:
    """Publish ``raw`` under ``identity`` (signed with the test's secret when ``sign``),
    naming ``owner`` (a key's sha256) in it when given."""
    if owner is not None:
        raw = {**raw, OWNER_FIELD: owner}
    return await client.execute_update_with_start_workflow(
        WorkerRegistryWorkflow.publish,
        PublishRequest(
            identity=identity,
            ttl_seconds=ttl,
            entry=signed(raw, settings) if sign else raw,
        ),
        start_workflow_operation=WithStartWorkflowOperation(
            WorkerRegistryWorkflow.run,
            RegistryState(),
            id=names.worker_registry_workflow_id(settings.task_queue_suffix),
            task_queue=settings.queue(names.PIPELINES_QUEUE),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        ),
        rpc_timeout=timedelta(seconds=10),
    )
