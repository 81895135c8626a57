"""Pipelines in Temporal's visibility store: the list query and the listed row.

Every pipeline carries the search attributes of
:func:`aiworker.schemas.names.pipeline_search_attributes` (status, tenant,
name); ``aiworker list`` and :meth:`PipelineClient.list_pipelines
<aiworker.workers.client.client.PipelineClient.list_pipelines>` filter on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names


@dataclass(frozen=True)
class PipelineSummary:
    """One pipeline as the visibility store lists it.

    Attributes:
        workflow_id: the pipeline's workflow id.
        run_id: the run listed (the latest of that id).
        status: the pipeline status (``AiworkerStatus``: ``running``, ``failed``, ...).
        tenant: the tenant the pipeline ran for.
        pipeline: the pipeline's name.
        execution_status: Temporal's status of the run (``RUNNING``, ``COMPLETED``, ...).
        start_time: when the run started.
    """

    workflow_id: str
    run_id: str
    status: str | None
    tenant: str | None
    pipeline: str | None
    execution_status: str | None
    start_time: datetime | None

    def to_json(self) -> dict[str, Any]:
        """The row as ``aiworker list --json`` prints it."""
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "status": self.status,
            "tenant": self.tenant,
            "pipeline": self.pipeline,
            "execution_status": self.execution_status,
            "start_time": self.start_time.isoformat() if self.start_time else None,
        }


def quote(value: str) -> str:
    """``value`` as a string literal of a visibility query."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def list_query(
    status: str | None = None, tenant: str | None = None, pipeline: str | None = None
) -> str:
    """The visibility query for pipelines with these search attribute values."""
    parts = [f"WorkflowType = {quote(names.PIPELINE_WORKFLOW)}"]
    for key, value in (
        (names.SA_STATUS, status),
        (names.SA_TENANT, tenant),
        (names.SA_PIPELINE, pipeline),
    ):
        if value:
            parts.append(f"{key} = {quote(value)}")
    return " AND ".join(parts)


async def last_redrive(client: Client, root: str) -> int:
    """The highest ``n`` of the ``<root>-redrive-<n>`` ids visibility lists (0: none).

    Visibility lags a little behind: a caller that starts the next id must
    still handle an id that turns out to be taken.
    """
    prefix = f"{root}-redrive-"
    last = 0
    try:
        async for wf in client.list_workflows(
            f"WorkflowId STARTS_WITH {quote(prefix)}", limit=1000
        ):
            tail = wf.id[len(prefix) :]
            if tail.isascii() and tail.isdigit():
                last = max(last, int(tail))
    except RPCError as e:  # a store without STARTS_WITH: count from 1 and probe
        if e.status != RPCStatusCode.INVALID_ARGUMENT:
            raise
    return last
