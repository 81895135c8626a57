"""The pipeline format users write, and the result a pipeline returns.

Checking a spec as a whole (unknown worker, cycle, dangling reference) lives
in :mod:`aiworker.schemas.pipeline_check`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from aiworker.schemas.base import Model
from aiworker.schemas.caps import HARD_MAX_STEPS
from aiworker.schemas.names import DEFAULT_TENANT, OK_STATUSES, TENANT_PATTERN
from aiworker.schemas.protocol import Usage
from aiworker.schemas.refs import find_refs

TerminalStatus = Literal[
    "succeeded",
    "partial",
    "failed",
    "rejected",
    "escalation_timed_out",
    "budget_exhausted",
    "cancelled",
]
StepStatus = Literal[
    "pending",
    "waiting",
    "running",
    "succeeded",
    "partial",
    "failed",
    "skipped",
    "blocked",
    "awaiting_review",
    "rejected",
    "cancelled",
    "escalation_timed_out",
]


class Budget(Model):
    """Limits across the whole pipeline, children included."""

    max_tokens: int | None = Field(default=None, ge=0)
    max_external_calls: int | None = Field(default=None, ge=0)
    deadline_seconds: float | None = Field(default=None, gt=0)


class StepRetry(Model):
    """Per-step override of the worker's retries; may only tighten."""

    max_attempts: int = Field(ge=1, le=100)


class Validation(Model):
    """The bounded validation loop of a step: run, validate, feed back reasons."""

    schema_: dict[str, Any] | bool = Field(alias="schema")
    max_attempts: int = Field(default=3, ge=1, le=10)
    feedback_field: str = Field(
        default="feedback", description="input field that receives the validator's reasons"
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Concurrency(Model):
    """At most ``limit`` steps (or pipelines) with the same ``key`` run at once,
    across every worker process; the key is a string or a ``${{ }}`` reference."""

    key: str = Field(min_length=1, max_length=200)
    limit: int = Field(ge=1, le=10_000)


class Step(Model):
    """One node of the pipeline DAG."""

    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$", max_length=64)
    worker: str
    input: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    when: dict[str, Any] | None = Field(
        default=None, description='{"value": <reference>, "schema": <JSON Schema>}'
    )
    for_each: str | list[Any] | None = None
    max_parallel: int = Field(default=10, ge=1, le=1000)
    gate: str | None = None
    fallback: str | None = Field(default=None, description="worker to run when this one fails")
    fallback_input: dict[str, Any] | None = None
    on_failure: Literal["fail", "continue", "escalate"] = "fail"
    timeout_seconds: float | None = Field(default=None, gt=0)
    retry: StepRetry | None = None
    validate_: Validation | None = Field(default=None, alias="validate")
    review_timeout_seconds: float = Field(default=86400, gt=0)
    concurrency: Concurrency | None = None
    chunk_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="for_each items per child workflow (keeps every history bounded)",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ResumeFrom(Model):
    """Redrive: reuse the outputs of steps that succeeded in an earlier run.

    ``workflow_id`` is the first run's id: idempotency keys keep using it so
    that a redriven publish is recognised as already done.
    """

    workflow_id: str = Field(min_length=1)
    run_id: str | None = None
    steps: dict[str, StepResult] = Field(default_factory=dict)


class PipelineSpec(Model):
    """A pipeline: the input of ``PipelineWorkflow``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    tenant: str = Field(default=DEFAULT_TENANT, pattern=TENANT_PATTERN)
    inputs: dict[str, Any] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    steps: list[Step] = Field(min_length=1, max_length=HARD_MAX_STEPS)
    output: dict[str, Any] = Field(default_factory=dict)
    resume_from: ResumeFrom | None = Field(
        default=None, description="set by `aiworker redrive`: results reused from a failed run"
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="at most `limit` pipelines with the same key (from inputs) run at once",
    )


class StepResult(Model):
    """How one step ended."""

    status: StepStatus
    attempts: int = 0
    error_code: str | None = None
    error_message: str | None = None
    duration_ms: float = 0.0
    outputs: Any = None
    warnings: list[dict[str, Any]] = Field(default_factory=list)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    reasons: list[dict[str, Any]] = Field(
        default_factory=list, description="the validator's or worker's reasons for a failure"
    )
    validation_attempts: int = Field(default=0, description="runs of the validation loop")
    fallback_used: bool = False
    reused_from: str | None = Field(default=None, description="workflow id of a redriven run")
    review: dict[str, Any] | None = Field(default=None, description="the human review decision")
    items: dict[str, int] | None = Field(
        default=None, description="for_each counts: total, succeeded, failed, skipped"
    )

    @property
    def ok(self) -> bool:
        """The step produced outputs (``succeeded`` or ``partial``)."""
        return self.status in OK_STATUSES


class ChunkItem(Model):
    """One for_each item with its resolved input (and concurrency key, if any)."""

    index: int = Field(ge=0)
    input: dict[str, Any]
    concurrency_key: str | None = None


class ChunkAllowance(Model):
    """The share of the pipeline budget a for_each chunk may spend."""

    max_tokens: int | None = None
    max_external_calls: int | None = None
    deadline: float | None = Field(default=None, description="POSIX seconds, workflow time")


class ChunkInput(Model):
    """The input of ``PipelineForEachWorkflow``: a bounded slice of a for_each."""

    step_id: str
    worker: str
    key_prefix: str
    tenant: str = Field(pattern=TENANT_PATTERN)
    trace_id: str
    queue_suffix: str = ""
    items: list[ChunkItem]
    max_parallel: int = Field(ge=1)
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    allowance: ChunkAllowance = Field(default_factory=ChunkAllowance)
    rate_limited: bool = Field(default=True, description="items wait for rate-limit permits")
    concurrency_limit: int | None = Field(
        default=None, ge=1, description="items with the same concurrency_key running at once"
    )
    lease_seconds: float = Field(default=3600.0, gt=0, description="one item's lease")


class ItemResult(Model):
    """How one for_each item ended (``outputs`` only when it succeeded)."""

    index: int
    status: Literal["succeeded", "partial", "failed"]
    outputs: Any = None
    attempts: int = 0
    error_code: str | None = None
    error_message: str | None = None


class ChunkResult(Model):
    """The result of ``PipelineForEachWorkflow``."""

    items: list[ItemResult]
    usage: Usage = Field(default_factory=Usage)


class ReviewDecision(Model):
    """The argument of the ``review`` Workflow Update."""

    decision: Literal["approve", "reject", "retry"]
    outputs: dict[str, Any] | None = Field(
        default=None, description="corrected outputs (approve); checked against the step's schema"
    )
    reviewer: str = Field(default="unknown", min_length=1, max_length=200)
    note: str | None = Field(default=None, max_length=4000)
    step: str | None = Field(default=None, description="the step under review, if several wait")


class PipelineResult(Model):
    """The result of ``PipelineWorkflow``."""

    status: TerminalStatus
    output: dict[str, Any] = Field(default_factory=dict)
    steps: dict[str, StepResult] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)
    trace_id: str | None = None
    error: dict[str, Any] | None = None
    redrive: dict[str, Any] | None = Field(
        default=None,
        description=(
            "a redriven run's summary: `from` (the first run's id), `reused` and `rerun` "
            "(step ids), `items_rerun` (for_each step id -> the item indexes run again)"
        ),
    )


ResumeFrom.model_rebuild()
PipelineSpec.model_rebuild()


def step_dependencies(spec: PipelineSpec) -> dict[str, set[str]]:
    """Each step's dependencies: ``depends_on``, its gate and the steps it references."""
    out: dict[str, set[str]] = {}
    for step in spec.steps:
        d = set(step.depends_on)
        if step.gate:
            d.add(step.gate)
        values: list[Any] = [step.input, step.when, step.for_each, step.fallback_input]
        if step.concurrency is not None:
            values.append(step.concurrency.key)
        for v in values:
            for ref in find_refs(v):
                if ref.step_id is not None and ref.step_id != step.id:
                    d.add(ref.step_id)
        out[step.id] = d
    return out
