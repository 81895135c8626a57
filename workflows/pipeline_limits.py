"""A pipeline's limits: which of its workers are rate limited, what its
tenant may do, its own concurrency slot, and the permits each step's call
waits for.

The tenant's registry entry comes in the run config, the ``run-config``
local activity's answer (an unknown tenant, or a redrive of another tenant's
run, is refused there, before any step); :meth:`PipelineLimits.hold_to_tenant`
applies it: a step naming a worker the tenant may not call is ``invalid_input``, its budget ceiling
tightens the spec's, and its concurrency ceiling is one more lease the
pipeline holds while it runs (:meth:`PipelineLimits.pipeline_slot`).

The permit protocol itself (asking, waiting for the ``permit`` signal,
releasing, answering lease checks) is :mod:`aiworker.workflows.limits`, shared
with the for_each chunks; this module decides what a pipeline asks for.
Every wait ends at the pipeline's deadline (a :class:`Deadline`).
Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.agent import AgentLimits
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import ConcurrencyCall, RunConfig, RunConfigCall
    from aiworker.schemas.options import lease_seconds
    from aiworker.schemas.pipeline import PipelineSpec, Step
    from aiworker.schemas.refs import ReferenceError_, resolve
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.schemas.tenants import refused_workers

from aiworker.workflows.budget import Deadline, Ledger
from aiworker.workflows.calls import error_code_of, invalid_input
from aiworker.workflows.limits import CallLimits, Lease, PermitBook, WaitExpired

# A pipeline's own concurrency lease: checked with the pipeline when it runs out,
# kept while the pipeline lives; with a deadline it lasts the deadline and a margin.
PIPELINE_LEASE_SECONDS = 3600.0
PIPELINE_LEASE_MARGIN = 60.0


def step_max_attempts(step: Step) -> int | None:
    """The step's own cap on its worker's attempts (None: the spec's retries)."""
    return step.retry.max_attempts if step.retry else None


@dataclass
class PipelineLimits:
    """The limits of one pipeline run and the permits it holds."""

    permits: PermitBook
    requester: str  # the pipeline's workflow id: permits are signalled to it
    tenant: str
    deadline: Deadline
    # The workers whose calls wait for a rate-limit permit; None before the run config: all.
    rate_limited: set[str] | None = None
    # The run config (recorded in the history); None before it is in.
    run_config: RunConfig | None = None

    async def load_run_config(
        self,
        spec: PipelineSpec,
        record: list[str],
        record_all: bool,
        pipeline: dict[str, Any],
    ) -> RunConfig:
        """Ask once, before any step, for the run config: which of the pipeline's
        workers are rate limited, what its tenant may do, the process's caps and
        local workers and (``record``; every known worker with ``record_all``) the
        specs of the workers it calls. One local activity, so the answer is in the
        history and the run decides from it from now on, also on replay.
        ``invalid_input`` when the tenant is refused. The activity checks
        ``pipeline`` in full too (``RunConfig.problems``): what compiles stays out
        of the workflow task."""
        workers = [s.worker for s in spec.steps if s.wait is None]
        workers += [s.fallback for s in spec.steps if s.fallback]
        # an agent's model turns and tools too: they wait for the same permits
        workers += record
        resume = spec.resume_from.workflow_id if spec.resume_from else None
        try:
            self.run_config = await workflow.execute_local_activity(
                names.RUN_CONFIG,
                RunConfigCall(
                    tenant=spec.tenant,
                    workers=sorted(set(workers)),
                    resume_from=resume,
                    record=record,
                    record_all=record_all,
                    pipeline=pipeline,
                ),
                result_type=RunConfig,
                summary=(
                    f"run config: limits, caps and worker specs (tenant {spec.tenant}, "
                    f"{len(set(workers))} named)"
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
            )
        except ActivityError as e:
            if error_code_of(e) != ErrorCode.INVALID_INPUT.value:
                raise
            cause = e.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(e)
            raise invalid_input(f"pipeline: {message}") from None
        self.rate_limited = set(self.run_config.rate_limited)
        return self.run_config

    def hold_to_tenant(self, spec: PipelineSpec, ledger: Ledger) -> None:
        """Apply the tenant's registry entry (if any) before any step runs."""
        policy = self.run_config.tenant if self.run_config is not None else None
        if policy is None:
            return
        # steps first, then agents' turns and tools: the order the message has always had
        problems = [str(p) for p in refused_workers(spec, policy, agents=False)]
        problems += [str(p) for p in refused_workers(spec, policy, steps=False)]
        if problems:
            raise invalid_input("; ".join(problems), problems)
        ledger.hold_to(policy.budget)
        self.deadline = ledger.ends

    def for_agent(self) -> AgentLimits:
        """What an llm-agent step's child holds its calls to: the rate-limited workers
        of the run config (the run asked about the agent's too) and the tenant's
        worker list."""
        policy = self.run_config.tenant if self.run_config is not None else None
        return AgentLimits(
            rate_limited=sorted(self.rate_limited or ()),
            allowed=None if policy is None or policy.workers is None else list(policy.workers),
        )

    def is_rate_limited(self, worker_id: str) -> bool:
        return self.rate_limited is None or worker_id in self.rate_limited

    def is_local(self, worker_id: str) -> bool:
        """Whether calls of ``worker_id`` run as local activities: as the run config
        says (none before it)."""
        return self.run_config is not None and worker_id in self.run_config.local

    async def pipeline_slot(self, spec: PipelineSpec) -> list[Lease] | str:
        """Wait for the pipeline's own concurrency slots: its tenant's (the registry's
        ``concurrency``), then its spec's (``concurrency`` on the pipeline).

        Returns the leases to give back at the end, or, when the deadline passed
        while it waited, why nothing ran.
        """
        policy = self.run_config.tenant if self.run_config is not None else None
        tenant_limit = policy.concurrency if policy is not None else None
        if spec.concurrency is None and tenant_limit is None:
            return []
        key: str | None = None
        if spec.concurrency is not None:
            try:
                key = str(resolve(spec.concurrency.key, {"inputs": spec.inputs}))
            except ReferenceError_ as e:
                raise invalid_input(f"pipeline: field 'concurrency.key': {e}") from None
        seconds = spec.budget.deadline_seconds
        # renewed by the limiter's lease checks for as long as this pipeline lives
        lease = PIPELINE_LEASE_SECONDS if seconds is None else seconds + PIPELINE_LEASE_MARGIN
        ticket = f"{self.requester}/{workflow.uuid4().hex[:8]}"
        calls = []
        if tenant_limit is not None:
            calls.append(
                ConcurrencyCall(
                    key=self.tenant,
                    scope="tenant",
                    limit=tenant_limit,
                    requester=self.requester,
                    ticket=f"{ticket}/tenant",
                    lease_seconds=lease,
                )
            )
        if spec.concurrency is not None and key is not None:
            calls.append(
                ConcurrencyCall(
                    key=key,
                    limit=spec.concurrency.limit,
                    requester=self.requester,
                    ticket=f"{ticket}/pipeline",
                    lease_seconds=lease,
                )
            )
        leases = await self.permits.acquire_all(calls, self.deadline.wait)
        if isinstance(leases, WaitExpired):
            tenant_wait = isinstance(leases.call, ConcurrencyCall) and leases.call.scope == "tenant"
            which = f"tenant {self.tenant}" if tenant_wait else key
            return f"{leases.message} ({which})"
        return leases

    def ticket(self, step_id: str) -> str:
        """A fresh ticket base for one call of ``step_id``. Drawn for every call,
        limited or not: the ids drawn after it must not shift on replay."""
        return f"{self.requester}/{step_id}/{workflow.uuid4().hex[:8]}"

    def for_worker(
        self, worker: WorkerSpec, step: Step, concurrency_key: str | None = None
    ) -> CallLimits:
        """What a call of ``worker`` in ``step`` waits for (the key resolved by the caller)."""
        return CallLimits(
            requester=self.requester,
            worker_id=worker.worker_id,
            tenant=self.tenant,
            rate_limited=self.is_rate_limited(worker.worker_id),
            concurrency_key=concurrency_key,
            concurrency_limit=step.concurrency.limit if step.concurrency else 1,
            lease_seconds=lease_seconds(worker, step.timeout_seconds, step_max_attempts(step)),
        )
