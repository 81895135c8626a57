"""Bulk actions by filter: ``aiworker cancel|terminate|redrive --query Q``.

The runs an action touches are named by a visibility query, scoped here to
pipelines (``WorkflowType``), to one tenant unless the operator asks for all
(:func:`scoped_query`), and to the runs the action can apply to: running ones
for cancel and terminate, ended ones for redrive.

Cancel and terminate are Temporal batch operations
(``StartBatchOperation`` with the scoped query): the server lists the runs and
acts on each at its own pace, and the job survives the CLI process; its
progress is ``DescribeBatchOperation``'s counts (:func:`wait_batch`).
Redrive has no batch operation in Temporal (it starts a new workflow from an
old one's history and results), so it goes run by run through
:meth:`~aiworker.workers.client.client.PipelineClient.redrive`
(:func:`redrive_all`).

The scope is ``(Q) AND WorkflowType IN (...) AND AiworkerTenant = ... AND
<status>``: whatever the user's query says, a bulk action reaches only
pipelines (:data:`BULK_WORKFLOW_TYPES`; never aiworker's own registry, limiter,
breaker or flow workflows) of the tenant asked for. The query is lexed as the
server reads it (:mod:`~aiworker.workers.client.query_lexer`) and refused when
anything in it could end ``(Q)`` early: a comment (the server drops them, so
``/*(*/ a) OR (b /*)*/`` balances for a parenthesis count and not for the
server), an unterminated string, an unbalanced parenthesis. The tenant scope
keeps an operator from touching another tenant's runs by mistake; whoever runs
the CLI holds the namespace's credentials, so it is not a boundary against
them (a namespace per tenant is).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from temporalio.api.batch.v1 import BatchOperationCancellation, BatchOperationTermination
from temporalio.api.enums.v1 import BatchOperationState
from temporalio.api.workflowservice.v1 import (
    DescribeBatchOperationRequest,
    StartBatchOperationRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names
from aiworker.workers.client.client import PipelineClient, RedriveError
from aiworker.workers.client.query_lexer import QueryLexError, check_query
from aiworker.workers.client.visibility import quote

Action = Literal["cancel", "terminate", "redrive"]

# Above this many matching runs a bulk action asks for confirmation (or --yes).
BULK_CONFIRM_THRESHOLD = 20
# How many ids --dry-run (and the confirmation) shows.
SAMPLE_IDS = 10
# How often the CLI reads a batch job's counts while it runs.
BATCH_POLL_SECONDS = 0.5

# What a bulk action may reach: pipelines, redriven ones included (a redrive is a
# PipelineWorkflow too). Their chunks (PipelineForEachWorkflow) and agents
# (AgentWorkflow) are children and go with their parent: a cancelled or terminated
# pipeline takes them along, a redrive runs them again. aiworker's own workflows
# (registry, limiters, breakers, flows, evals) are never a bulk action's to touch.
BULK_WORKFLOW_TYPES: tuple[str, ...] = (names.PIPELINE_WORKFLOW,)

_ENDED = {
    BatchOperationState.BATCH_OPERATION_STATE_COMPLETED,
    BatchOperationState.BATCH_OPERATION_STATE_FAILED,
}


class BulkQueryError(ValueError):
    """A query the CLI or the server refuses; the message says why."""


def scoped_query(query: str, tenant: str | None, action: Action) -> str:
    """``(query)`` limited to pipelines (:data:`BULK_WORKFLOW_TYPES`), ``tenant``'s
    (None: every tenant), and the runs ``action`` applies to (running for
    cancel/terminate, ended for redrive).

    The query is lexed first (:func:`~aiworker.workers.client.query_lexer.check_query`):
    a comment, an unterminated string or an unbalanced parenthesis could make the
    server read ``(query)`` as something that ends before the scope does.

    Raises:
        BulkQueryError: the query is empty or could step out of the parentheses.
    """
    if not query.strip():
        raise BulkQueryError("--query is empty")
    try:
        check_query(query)
    except QueryLexError as e:
        raise BulkQueryError(
            f"--query refused: {e} (the query is combined with the tenant and pipeline "
            "scope as `(Q) AND ...`, and nothing in it may end that scope)"
        ) from None
    types = ", ".join(quote(t) for t in BULK_WORKFLOW_TYPES)
    parts = [f"({query})", f"WorkflowType IN ({types})"]
    if tenant is not None:
        parts.append(f"{names.SA_TENANT} = {quote(tenant)}")
    running = "ExecutionStatus = 'Running'"
    parts.append(running if action != "redrive" else f"NOT ({running})")
    return " AND ".join(parts)


def _refused(e: RPCError, query: str) -> BulkQueryError:
    return BulkQueryError(f"the server refused the query {query!r}: {e.message}")


@dataclass
class Matches:
    """What a scoped query matches: the count and the first ids."""

    query: str
    count: int
    first: list[str]


async def match(client: Client, query: str) -> Matches:
    """Count the runs ``query`` (a :func:`scoped_query`) matches, with the first ids.

    Raises:
        BulkQueryError: the server refused the query (INVALID_ARGUMENT).
    """
    try:
        count = (await client.count_workflows(query)).count
        first = [w.id async for w in client.list_workflows(query, limit=SAMPLE_IDS)]
    except RPCError as e:
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise _refused(e, query) from None
        raise
    return Matches(query, count, first)


async def start_batch(
    client: Client, query: str, action: Literal["cancel", "terminate"], reason: str
) -> str:
    """Start a Temporal batch operation that cancels or terminates every run
    ``query`` matches; returns its job id (``temporal batch describe --job-id``).

    Raises:
        BulkQueryError: the server refused the query.
    """
    job_id = f"aiworker-{action}-{uuid.uuid4().hex[:12]}"
    identity = client.identity
    op: dict[str, Any] = (
        {"cancellation_operation": BatchOperationCancellation(identity=identity)}
        if action == "cancel"
        else {"termination_operation": BatchOperationTermination(identity=identity)}
    )
    request = StartBatchOperationRequest(
        namespace=client.namespace,
        visibility_query=query,
        job_id=job_id,
        reason=reason,
        **op,
    )
    try:
        await client.workflow_service.start_batch_operation(request)
    except RPCError as e:
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise _refused(e, query) from None
        raise
    return job_id


@dataclass
class BatchProgress:
    """A batch job's counts as the server reports them."""

    job_id: str
    state: str
    total: int
    done: int
    failed: int

    @property
    def ended(self) -> bool:
        return self.state in ("completed", "failed")


async def batch_progress(client: Client, job_id: str) -> BatchProgress:
    """A batch job's state and counts (``DescribeBatchOperation``)."""
    r = await client.workflow_service.describe_batch_operation(
        DescribeBatchOperationRequest(namespace=client.namespace, job_id=job_id)
    )
    state = BatchOperationState.Name(r.state).removeprefix("BATCH_OPERATION_STATE_").lower()
    return BatchProgress(
        job_id,
        state,
        r.total_operation_count,
        r.complete_operation_count,
        r.failure_operation_count,
    )


async def wait_batch(
    client: Client, job_id: str, on_progress: Callable[[BatchProgress], None]
) -> BatchProgress:
    """Read a batch job's counts until it ends, telling ``on_progress`` each change.

    The job runs on the server whatever happens here: an interrupted CLI leaves
    it running (``temporal batch describe --job-id``)."""
    last: tuple[str, int, int, int] | None = None
    while True:
        p = await batch_progress(client, job_id)
        now = (p.state, p.total, p.done, p.failed)
        if now != last:
            on_progress(p)
            last = now
        if p.ended:
            return p
        await asyncio.sleep(BATCH_POLL_SECONDS)


@dataclass
class RedriveOutcome:
    """What :func:`redrive_all` did: new runs by old id, and refusals by old id."""

    started: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


async def redrive_all(
    pipelines: PipelineClient,
    query: str,
    *,
    tenant: str | None,
    from_step: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    new_idempotency_keys: bool = False,
    on_progress: Callable[[int, int, str, str | None, str | None], None] | None = None,
) -> RedriveOutcome:
    """Redrive every run ``query`` matches, one after another (Temporal has no batch
    operation that starts a workflow from another's history). A run that cannot
    be redriven (it succeeded, another tenant's, ...) is counted in ``refused``
    with the reason and the rest go on. ``on_progress(i, n, old, new, refused)``
    after each.

    Raises:
        BulkQueryError: the server refused the query.
    """
    try:
        ids = [w.id async for w in pipelines.temporal.list_workflows(query)]
    except RPCError as e:
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise _refused(e, query) from None
        raise
    out = RedriveOutcome()
    for i, wid in enumerate(ids, 1):
        new: str | None = None
        why: str | None = None
        try:
            handle = await pipelines.redrive(
                wid,
                tenant,
                from_step=from_step,
                inputs=inputs,
                new_idempotency_keys=new_idempotency_keys,
            )
            new = out.started[wid] = handle.id
        except RedriveError as e:
            why = out.refused[wid] = str(e)
        if on_progress is not None:
            on_progress(i, len(ids), wid, new, why)
    return out
