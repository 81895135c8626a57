"""The pipeline format users write, and the result a pipeline returns.

Checking a spec as a whole (unknown worker, cycle, dangling reference) lives
in :mod:`aiworker.schemas.pipeline_check`.

Long on purpose: every field carries its ``description``, from which
``docs/reference/`` is generated, so the user-facing contract and its
documentation stay one text in one place.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

from pydantic import ConfigDict, Field

from aiworker.schemas.base import Model
from aiworker.schemas.callbacks import TOKEN_FIELDS, Wait
from aiworker.schemas.caps import HARD_MAX_STEPS
from aiworker.schemas.causes import ErrorCause, PipelineError, without_outputs
from aiworker.schemas.flow import Flow
from aiworker.schemas.names import (
    DEFAULT_TENANT,
    OK_STATUSES,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    TENANT_PATTERN,
)
from aiworker.schemas.protocol import ArtifactRef, CachePolicy, Usage, Usd
from aiworker.schemas.refs import find_refs
from aiworker.schemas.spec import RecordedSpec

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

    max_tokens: int | None = Field(
        default=None,
        ge=0,
        description="tokens (input + output, every attempt) the whole pipeline may spend; "
        "unset: no limit",
    )
    max_external_calls: int | None = Field(
        default=None,
        ge=0,
        description="external calls (page fetches, model calls, webhooks) the whole "
        "pipeline may make; unset: no limit",
    )
    deadline_seconds: float | None = Field(
        default=None,
        gt=0,
        description="seconds from the pipeline's start after which no step is started; "
        "unset: no deadline",
    )
    max_cost_usd: Usd | None = Field(
        default=None,
        description="US dollars the model calls of the whole pipeline may cost (a number "
        "or a decimal string), priced from the model aliases' prices; once spent, no step "
        "that may use tokens is started; unset: no limit",
    )


class StepRetry(Model):
    """Per-step override of the worker's retries; may only tighten."""

    max_attempts: int = Field(
        ge=1, le=100, description="attempts of each call; above the worker spec's is invalid_input"
    )


class Validation(Model):
    """The bounded validation loop of a step: run, validate, feed back reasons."""

    schema_: dict[str, Any] | bool = Field(
        alias="schema", description="the JSON Schema the step's outputs must match"
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="runs of the step, each after the validator's reasons of the last",
    )
    feedback_field: str = Field(
        default="feedback", description="input field that receives the validator's reasons"
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Concurrency(Model):
    """At most ``limit`` steps (or pipelines) with the same ``key`` run at once,
    across every worker process; the key is a string or a ``${{ }}`` reference."""

    key: str = Field(
        min_length=1,
        max_length=200,
        description="the key that shares the limit: a string or a ${{ }} reference "
        "(a step's may use item; a pipeline's only inputs)",
    )
    limit: int = Field(ge=1, le=10_000, description="at most this many hold the key at once")


class Step(Model):
    """One node of the pipeline DAG."""

    id: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$",
        max_length=64,
        description="unique in the pipeline; references name it (steps.<id>.outputs)",
    )
    worker: str = Field(
        default="",
        description="the worker_id to call (aiworker workers lists them); a wait step has none",
    )
    wait: Wait | None = Field(
        default=None,
        description='{"schema": <JSON Schema>, "timeout_seconds": N}: instead of a worker, '
        "hand out a token (${{ steps.<id>.token }}, ${{ steps.<id>.callback_url }}) and wait "
        "for its callback (docs/callbacks.md)",
    )
    input: dict[str, Any] = Field(
        default_factory=dict,
        description="the worker's input: JSON with ${{ }} references, checked against the "
        "worker's input_schema",
    )
    depends_on: list[str] = Field(
        default_factory=list,
        description="steps that must end first (steps it references are added by themselves)",
    )
    when: dict[str, Any] | None = Field(
        default=None,
        description='{"value": <reference>, "schema": <JSON Schema>}: the step runs only when '
        "the value matches, else it is skipped",
    )
    for_each: str | list[Any] | None = Field(
        default=None,
        description="a list, or a reference to one: the worker runs once per item "
        "(${{ item }}, ${{ item_index }} in input)",
    )
    max_parallel: int = Field(
        default=10, ge=1, le=1000, description="for_each items running at once"
    )
    tolerated_failures: int | str | None = Field(
        default=None,
        description="for_each: items that may fail, a count (N >= 0) or a share of the items "
        '("N%" of the item count, 0-100, decimals allowed, rounded down); one failure more '
        "and no item starts, those in flight are cancelled and the step fails with "
        "too_many_failures (docs/foreach.md)",
    )
    gate: str | None = Field(
        default=None,
        description="a validator step that must have passed (valid: true) before this one "
        "runs, else blocked",
    )
    fallback: str | None = Field(
        default=None, description="worker to run once, when this one's attempts are spent"
    )
    fallback_input: dict[str, Any] | None = Field(
        default=None, description="the fallback's input; default: the step's input"
    )
    on_failure: Literal["fail", "continue", "escalate"] = Field(
        default="fail",
        description="fail the pipeline, continue without the step, or escalate to human review",
    )
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="each attempt's timeout; may only tighten the worker spec's",
    )
    retry: StepRetry | None = Field(
        default=None, description="retries of this step; may only tighten the worker spec's"
    )
    validate_: Validation | None = Field(
        default=None,
        alias="validate",
        description="the validation loop: outputs checked against a schema, the step rerun "
        "with the reasons",
    )
    review_timeout_seconds: float = Field(
        default=86400,
        gt=0,
        description="how long an escalated step waits for a review before the pipeline ends "
        "escalation_timed_out",
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="at most limit steps (for_each: items) with this key run at once, across "
        "every process",
    )
    chunk_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="for_each items per child workflow (keeps every history bounded)",
    )
    items_per_task: int = Field(
        default=1,
        ge=1,
        le=100,
        description="for_each items per activity task: above 1 a task runs several items "
        "at once in the worker, each with its own result, retries, permits and budget "
        "(python and prompt workers only; see docs/foreach.md)",
    )
    cache: CachePolicy | None = Field(
        default=None,
        description='{"ttl_seconds": N}: reuse the stored result of an earlier call with the '
        "same worker, spec version, tenant and resolved input (for_each: per item); refused "
        "on a worker with side_effects",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ResumeFrom(Model):
    """Redrive: reuse the outputs of steps that succeeded in an earlier run.

    ``workflow_id`` is the first run's id: idempotency keys keep using it so
    that a redriven publish is recognised as already done, unless ``new_keys``.
    """

    workflow_id: str = Field(min_length=1, description="the first run's workflow id")
    run_id: str | None = Field(default=None, description="the first run's run id")
    steps: dict[str, StepResult] = Field(
        default_factory=dict, description="results reused as they are, by step id"
    )
    new_keys: bool = Field(
        default=False,
        description="the steps that run again take idempotency keys under the new run's id "
        "(`aiworker redrive --new-idempotency-keys`); false: the first run's, so an effect "
        "already done is recognised as done",
    )


class PipelineSpec(Model):
    """A pipeline: the input of ``PipelineWorkflow``."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=100,
        description="the pipeline's name: search attribute AiworkerPipeline, default "
        "workflow id prefix",
    )
    tenant: str = Field(
        default=DEFAULT_TENANT,
        pattern=TENANT_PATTERN,
        description="who the pipeline runs for: limits, sinks, caches and artifacts are "
        "scoped by it",
    )
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="any JSON, referenced as ${{ inputs.<path> }}"
    )
    budget: Budget = Field(
        default_factory=Budget,
        description="limits across the whole pipeline, for_each children included",
    )
    steps: list[Step] = Field(
        min_length=1, max_length=HARD_MAX_STEPS, description="the DAG's steps, in any order"
    )
    output: dict[str, Any] = Field(
        default_factory=dict,
        description="the result's output: JSON with ${{ }} references, resolved at the end",
    )
    resume_from: ResumeFrom | None = Field(
        default=None, description="set by `aiworker redrive`: results reused from a failed run"
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="at most `limit` pipelines with the same key (from inputs) run at once",
    )
    priority: int | None = Field(
        default=None,
        ge=PRIORITY_HIGHEST,
        le=PRIORITY_LOWEST,
        strict=True,
        description="Temporal's task priority, 1 (highest) to 5 (lowest), for the pipeline "
        "and every activity and child it starts; unset: the server's default (3)",
    )
    flow: Flow | None = Field(
        default=None,
        description="flow control on starts, keyed by inputs: debounce, batch, singleton "
        "or throttle (docs/flow-control.md)",
    )


class StepResult(Model):
    """How one step ended."""

    status: StepStatus = Field(description="how the step ended (or where it is)")
    attempts: int = Field(default=0, description="calls of the worker, retries included")
    error_code: str | None = Field(default=None, description="the stable error code, if it failed")
    error_message: str | None = Field(default=None, description="what went wrong, in one line")
    duration_ms: float = Field(default=0.0, description="wall time of the step")
    outputs: Any = Field(default=None, description="the worker's outputs (for_each: a list)")
    warnings: list[dict[str, Any]] = Field(
        default_factory=list, description="[{code, message, field}]: what a partial result lacks"
    )
    artifacts: list[dict[str, Any]] = Field(
        default_factory=list, description="ArtifactRefs the worker wrote (uri, sha256, size)"
    )
    usage: Usage = Field(default_factory=Usage, description="what the step consumed")
    reasons: list[dict[str, Any]] = Field(
        default_factory=list, description="the validator's or worker's reasons for a failure"
    )
    validation_attempts: int = Field(default=0, description="runs of the validation loop")
    fallback_used: bool = Field(default=False, description="the fallback worker produced it")
    reused_from: str | None = Field(default=None, description="workflow id of a redriven run")
    cached: bool = Field(
        default=False,
        description="the outputs came from the step cache (for_each: every item's did)",
    )
    review: dict[str, Any] | None = Field(
        default=None,
        description="the human review decision: decision, reviewer, note, step, update_id, at",
    )
    items: dict[str, int] | None = Field(
        default=None,
        description="for_each counts: total, succeeded, failed, skipped; cached (items from "
        "the step cache) when any were",
    )
    cause: list[ErrorCause] = Field(
        default_factory=list,
        description="the failures this result came through, newest first (a failed step's "
        "first entry is its own error in detail; an approved step keeps what was approved over)",
    )

    @property
    def ok(self) -> bool:
        """The step produced outputs (``succeeded`` or ``partial``)."""
        return self.status in OK_STATUSES

    def as_error(self, step_id: str) -> PipelineError:
        """This step's failure as the pipeline's ``error``."""
        return PipelineError(
            code=self.error_code or self.status,
            message=self.error_message or f"step {step_id!r} ended {self.status}",
            step=step_id,
            cause=without_outputs(self.cause),
        )


SPILL_METADATA = "aiworker-spill"
"""Payload metadata key of a for_each chunk's input or result: such a payload
leaves the history for the external payload store above a small threshold, so
no item's bytes land in a parent's history (``workers/process/payload_storage.py``)."""


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
    max_cost_usd: Usd | None = Field(
        default=None, description="US dollars the chunk's items may cost before it refuses more"
    )


class ChunkInput(Model):
    """The input of ``PipelineForEachWorkflow``: a bounded slice of a for_each.

    With ``chunk_size`` set and more items than that, the chunk runs no item
    itself: it splits its items into child chunks (a tree, so that every
    workflow's history stays bounded however many items the step has).
    """

    spill: ClassVar[bool] = True  # travels by reference (SPILL_METADATA)

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
    cache: CachePolicy | None = Field(default=None, description="the step's cache, per item")
    allowance: ChunkAllowance = Field(default_factory=ChunkAllowance)
    rate_limited: bool = Field(default=True, description="items wait for rate-limit permits")
    concurrency_limit: int | None = Field(
        default=None, ge=1, description="items with the same concurrency_key running at once"
    )
    lease_seconds: float = Field(default=3600.0, gt=0, description="one item's lease")
    chunk_size: int | None = Field(
        default=None,
        ge=1,
        description="items per leaf chunk: a chunk with more items runs them in child chunks",
    )
    chunk_slots: int = Field(
        default=1, ge=1, description="leaf chunks under this chunk running at once"
    )
    local: bool = Field(
        default=False, description="items run as local activities (the parent's plan said so)"
    )
    items_per_task: int = Field(
        default=1, ge=1, le=100, description="items per activity task (the step's)"
    )
    store_outputs: bool = Field(
        default=False,
        description="items' outputs go to the artifact store; the result lists only "
        "failed items, counts the others and carries the stored parts' references",
    )
    spec: RecordedSpec | None = Field(
        default=None,
        description="the worker's spec as the pipeline recorded it at its start (None: "
        "refused as invalid_input; a chunk never reads a catalog)",
    )
    tolerated: int | None = Field(
        default=None,
        ge=0,
        description="failed items this chunk may still tolerate (the step's "
        "tolerated_failures less the failures counted when it started); one more and it "
        "starts no item and cancels those in flight (None: no threshold)",
    )


class ItemResult(Model):
    """How one for_each item ended (``outputs`` only when it succeeded)."""

    index: int
    status: Literal["succeeded", "partial", "failed", "cancelled", "not_started"] = Field(
        description="cancelled / not_started: stopped by the step's tolerated_failures"
    )
    outputs: Any = None
    attempts: int = 0
    cached: bool = False
    error_code: str | None = None
    error_message: str | None = None


class ChunkResult(Model):
    """The result of ``PipelineForEachWorkflow``."""

    spill: ClassVar[bool] = True  # travels by reference (SPILL_METADATA)

    items: list[ItemResult] = Field(
        description="every item; with store_outputs only the failed ones (the rest are counted)"
    )
    usage: Usage = Field(default_factory=Usage)
    succeeded: int = Field(
        default=0, ge=0, description="items not listed in items that succeeded (store_outputs)"
    )
    cached: int = Field(default=0, ge=0, description="of those, items the step cache answered")
    parts: list[ArtifactRef] = Field(
        default_factory=list, description="the stored outputs of those items (store_outputs)"
    )


ITEMS_REF_KIND: Final = "aiworker.items"
"""``kind`` of a for_each step's ``outputs.items`` held by reference (:class:`ItemsRef`)."""


class ItemsRef(Model):
    """A large for_each step's ``outputs.items``, by reference.

    Above ``AIWORKER_FOREACH_INLINE_ITEMS`` items a for_each keeps no item's
    outputs in the pipeline: each leaf chunk stores its items' outputs in the
    artifact store (one part, a JSON object ``{"kind": "aiworker.items.part",
    "items": [[index, outputs], ...]}``), each group chunk an index of its
    children's parts (``{"kind": "aiworker.items.index", "parts": [...]}``), and
    the step's ``outputs.items`` is this reference. A ``${{ }}`` reference to
    the list (``steps.<id>.outputs.items`` or below) loads it first, so later
    steps and the pipeline's ``output`` see the list as before; the result and
    the UI carry the reference. An item that failed has no entry (``null`` in
    the loaded list); a later part overrides an earlier one for the same index
    (a redrive adds its parts after the old ones).
    """

    kind: Literal["aiworker.items"] = ITEMS_REF_KIND
    count: int = Field(ge=0, description="items of the step (the loaded list's length)")
    parts: list[ArtifactRef] = Field(description="the stored parts, in the order to apply them")

    @classmethod
    def of(cls, value: Any) -> ItemsRef | None:
        """``value`` (a step's ``outputs.items``) as a reference; None for an inline list."""
        if isinstance(value, dict) and value.get("kind") == ITEMS_REF_KIND:
            try:
                return cls.model_validate(value)
            except ValueError:  # not one the engine wrote: a value like any other
                return None
        return None


class StoreItems(Model):
    """Input of the ``foreach-store-items`` local activity: a leaf chunk's outputs."""

    tenant: str = Field(pattern=TENANT_PATTERN)
    items: list[tuple[int, Any]] = Field(
        default_factory=list, description="(item index, outputs) of each item"
    )
    parts: list[ArtifactRef] = Field(
        default_factory=list,
        description="a group chunk's parts, stored instead as one index part",
    )


class LoadItems(Model):
    """Input of the ``foreach-load-items`` local activity."""

    tenant: str = Field(pattern=TENANT_PATTERN)
    ref: ItemsRef


class LoadedItems(Model):
    """A for_each step's items, loaded: one entry per item, null where it failed."""

    spill: ClassVar[bool] = True  # travels by reference (SPILL_METADATA)

    items: list[Any]


class ReviewDecision(Model):
    """The argument of the ``review`` Workflow Update."""

    decision: Literal["approve", "reject", "retry"] = Field(
        description="approve (optionally with corrected outputs), reject, or retry the step"
    )
    outputs: dict[str, Any] | None = Field(
        default=None, description="corrected outputs (approve); checked against the step's schema"
    )
    reviewer: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="who decides; the review record names the Update's id when not given",
    )
    note: str | None = Field(default=None, max_length=4000, description="kept in the step's result")
    step: str | None = Field(default=None, description="the step under review, if several wait")


class PipelineResult(Model):
    """The result of ``PipelineWorkflow``."""

    status: TerminalStatus = Field(description="the terminal status")
    output: dict[str, Any] = Field(
        default_factory=dict, description="the spec's output with its references resolved"
    )
    steps: dict[str, StepResult] = Field(default_factory=dict, description="each step, by id")
    usage: Usage = Field(default_factory=Usage, description="the whole pipeline's consumption")
    trace_id: str | None = Field(default=None, description="the OpenTelemetry trace of the run")
    error: PipelineError | None = Field(
        default=None,
        description="why the pipeline did not succeed: the first failing step's code, "
        "message, id and cause chain; null on success",
    )
    warnings: list[dict[str, Any]] = Field(
        default_factory=list,
        description="problems that did not fail the pipeline: {code, message, field}, e.g. an "
        "`output` entry that could not be resolved",
    )
    redrive: dict[str, Any] | None = Field(
        default=None,
        description=(
            "a redriven run's summary: `from` (the first run's id), `reused` and `rerun` "
            "(step ids), `items_rerun` (for_each step id -> the item indexes run again)"
        ),
    )


ResumeFrom.model_rebuild()
PipelineSpec.model_rebuild()


def step_values(step: Step) -> list[Any]:
    """The parts of ``step`` that may hold ``${{ }}`` references."""
    values: list[Any] = [step.input, step.when, step.for_each, step.fallback_input]
    if step.concurrency is not None:
        values.append(step.concurrency.key)
    return values


def _is_token_ref(path: tuple[str | int, ...]) -> bool:
    return len(path) == 2 and path[1] in TOKEN_FIELDS


def step_dependencies(spec: PipelineSpec) -> dict[str, set[str]]:
    """Each step's dependencies: ``depends_on``, its gate and the steps it references
    (but a wait step referenced only for its ``token``/``callback_url``: see
    :func:`token_dependencies`)."""
    out: dict[str, set[str]] = {}
    for step in spec.steps:
        d = set(step.depends_on)
        if step.gate:
            d.add(step.gate)
        for v in step_values(step):
            for ref in find_refs(v):
                if ref.step_id is not None and ref.step_id != step.id:
                    if not _is_token_ref(ref.path):
                        d.add(ref.step_id)
        out[step.id] = d
    return out


def token_dependencies(spec: PipelineSpec) -> dict[str, set[str]]:
    """The wait steps each step references only for their ``token`` or
    ``callback_url``: it may start once their tokens exist, while they wait."""
    hard = step_dependencies(spec)
    out: dict[str, set[str]] = {}
    for step in spec.steps:
        soft = {
            ref.step_id
            for v in step_values(step)
            for ref in find_refs(v)
            if ref.step_id is not None and ref.step_id != step.id and _is_token_ref(ref.path)
        }
        if soft - hard[step.id]:
            out[step.id] = soft - hard[step.id]
    return out


def worker_steps(spec: PipelineSpec) -> list[Step]:
    """The steps that call a worker (every step but the wait steps)."""
    return [s for s in spec.steps if s.wait is None]
