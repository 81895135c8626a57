"""The state of one pipeline run, shared by the modules that run it.

:class:`Board` is what the workflow's handlers read and write (step results,
status, permits, review desk, external calls in flight); it exists from the
workflow's first moment, before the spec is checked. :class:`PipelineRun` is
built once the spec is checked: the spec, the worker specs, the ledger, the
ids every call carries and the run's terminal status once a step decided it.
The scheduler (``dag``), the step runner (``steps``), the fan-out
(``fanout``) and the limits (``pipeline_limits``) all work on one
``PipelineRun``. A step that ends before its worker runs (skipped, blocked,
refused) is a value, :class:`Ended`, not an exception. Deterministic code only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.caps import DEFAULT_FOREACH_INLINE_ITEMS, Caps
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import PipelineSpec, Step, StepResult, TerminalStatus
    from aiworker.schemas.refs import (
        ReferenceError_,
        ReferenceLimitError,
        SizeBudget,
        find_refs,
        resolve,
    )
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.workflows.redrive import Redrive

from aiworker.workflows.budget import Admission, BudgetRefused, Ledger
from aiworker.workflows.callbacks import CallbackDesk
from aiworker.workflows.details import StepBoard, StepTable
from aiworker.workflows.items import ItemsUnavailable, load_items, needs_items
from aiworker.workflows.limits import PermitBook
from aiworker.workflows.pipeline_limits import PipelineLimits
from aiworker.workflows.review import ReviewDesk
from aiworker.workflows.runs import in_run, this_run
from aiworker.workflows.step_events import StepEvents

MEMO_SEARCH_ATTRIBUTES = "search_attributes"


def now() -> float:
    """Workflow time as POSIX seconds."""
    return workflow.now().timestamp()


def ms_since(start: Any) -> float:
    """Milliseconds of workflow time since ``start`` (a ``workflow.now()``)."""
    delta: timedelta = workflow.now() - start
    return round(delta.total_seconds() * 1000, 3)


def search_attributes_on() -> bool:
    """False when the run's memo says its server has none of aiworker's search attributes.

    A server without them (the time-skipping test server cannot register any)
    would fail every upsert; such a run says so in its memo:
    ``{"search_attributes": false}``.
    """
    return bool(workflow.memo_value(MEMO_SEARCH_ATTRIBUTES, True, type_hint=bool))


@dataclass(frozen=True)
class Ended:
    """A step that ends without (or before) its worker's result: skipped, blocked,
    refused by the budget or a limit, or an input that cannot be resolved."""

    result: StepResult


@dataclass
class Board:
    """What the handlers see: step results, the run's status, and who waits for what.

    Every step result written and every status set also reaches :attr:`table`,
    the step table the Temporal UI shows as the workflow's current details.
    """

    steps: StepBoard = field(default_factory=StepBoard)
    status: str = "running"
    permits: PermitBook = field(default_factory=PermitBook)
    desk: ReviewDesk = field(default_factory=ReviewDesk)
    # The wait steps' tokens and their callbacks.
    callbacks: CallbackDesk = field(default_factory=CallbackDesk)
    # Steps calling an external worker now: step id -> its queue and wait bound.
    external: dict[str, dict[str, Any]] = field(default_factory=dict)
    table: StepTable = field(default_factory=StepTable)
    # The numbered step events the live event stream reads (the `events` query).
    events: StepEvents = field(default_factory=StepEvents)
    # Its status is set only inside this run (workflows.runs).
    run_id: str | None = field(default_factory=this_run)

    def __post_init__(self) -> None:
        self.steps.on_set = self._noted

    def _noted(self, step_id: str, result: StepResult) -> None:
        self.table.note(step_id, result)
        self.events.note(step_id, result)

    def set_status(self, status: str, error_code: str | None = None) -> None:
        """The run's status, upserted as the ``AiworkerStatus`` search attribute;
        at its end, the error code it ended with as ``AiworkerErrorCode`` in the same
        upsert."""
        if not in_run(self.run_id):
            # The coroutines of a run a stopped worker dropped, closed by the
            # garbage collector, run their ``finally`` blocks (review's status
            # reset) outside any workflow or inside another run's task: nothing
            # they do may reach a history (workflows.runs).
            return
        self.table.set_status(status)
        if status != self.status or status == "running":
            self.status = status
            if search_attributes_on():
                pairs = [names.STATUS_KEY.value_set(status)]
                if error_code is not None:
                    pairs.append(names.ERROR_CODE_KEY.value_set(error_code))
                workflow.upsert_search_attributes(pairs)


@dataclass
class PipelineRun:
    """One checked pipeline on its way: what every step needs to run."""

    spec: PipelineSpec
    workers: Mapping[str, WorkerSpec]
    board: Board
    ledger: Ledger
    key_base: str  # idempotency keys: this run's id, or the redriven run's
    queue_suffix: str
    trace_id: str
    limits: PipelineLimits
    # Set by a step that ends the whole run (budget spent, review timed out, rejected).
    terminal: TerminalStatus | None = None
    # A redrive's plan (what is reused, what runs again), None for a first run.
    redrive: Redrive | None = None
    # What every activity and child carries (schemas.priority.task_priority);
    # the default (nothing) unless the run or its spec has a priority key.
    priority: Priority = Priority.default
    # for_each steps whose outputs.items (a reference) a reference needed, loaded
    # once: the scope shows these lists; the step results keep the references.
    loaded_items: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    @property
    def steps(self) -> dict[str, StepResult]:
        return self.board.steps

    def scope(self) -> dict[str, Any]:
        """What ``${{ }}`` references see: the inputs and every step's results so far
        (and a wait step's ``token`` and ``callback_url`` once it has them)."""
        scope: dict[str, Any] = {
            "inputs": self.spec.inputs,
            "steps": {
                sid: {
                    "status": r.status,
                    "outputs": (
                        r.outputs | {"items": self.loaded_items[sid]}
                        if sid in self.loaded_items and isinstance(r.outputs, dict)
                        else r.outputs
                    ),
                    "warnings": r.warnings,
                    "artifacts": r.artifacts,
                }
                for sid, r in self.steps.items()
            },
        }
        desk = self.board.callbacks
        for sid in desk.issued:
            scope["steps"][sid].update(desk.scope_of(sid))
        return scope

    async def materialize(self, values: list[Any], field_name: str) -> StepResult | None:
        """Load the lists of the for_each steps held by reference that the
        references in ``values`` read (once per step); how the step (or output)
        fails if one cannot be loaded, else None."""
        for sid, ref in needs_items(values, self.steps):
            if sid in self.loaded_items:
                continue
            try:
                self.loaded_items[sid] = await load_items(self.tenant, ref)
            except ItemsUnavailable as e:
                return StepResult(
                    status="failed",
                    error_code=e.code,
                    error_message=f"field {field_name!r}: step {sid!r}'s items: {e.message}",
                )
        return None

    @property
    def inline_items(self) -> int:
        """Items of a for_each whose outputs stay inline, as the run config said."""
        run_config = self.limits.run_config
        return run_config.inline_items if run_config is not None else DEFAULT_FOREACH_INLINE_ITEMS

    @property
    def caps(self) -> Caps:
        """The process's caps, as the run config (recorded in history) said; the
        defaults until then."""
        run_config = self.limits.run_config
        return run_config.caps if run_config is not None else Caps()

    def size_budget(self, cap: str = "max_resolved_bytes") -> SizeBudget:
        """A size budget for one resolved value: the caps' ``cap`` bytes (one
        value's unless told) and the caps' nesting."""
        caps = self.caps
        return SizeBudget(getattr(caps, cap), caps.max_json_depth, cap=cap)

    @staticmethod
    def over_cap(step: Step, field_name: str, e: ReferenceLimitError) -> Ended:
        """How a step ends whose field resolves over a cap: failed with the cap's code
        (``invalid_input`` or ``payload_too_large``), naming the step and field."""
        return Ended(
            StepResult(
                status="failed",
                error_code=e.code,
                error_message=f"step {step.id!r}: field {field_name!r}: {e}",
            )
        )

    def resolve(
        self, step: Step, value: Any, field_name: str, budget: SizeBudget | None = None
    ) -> Any | Ended:
        """``value`` with its references resolved (within ``budget``, by default one
        value's caps), or how the step ends: failed over a cap; skipped when an
        upstream step has no outputs, else failed with ``invalid_input``."""
        try:
            return resolve(value, self.scope(), budget=budget or self.size_budget())
        except ReferenceLimitError as e:
            return self.over_cap(step, field_name, e)
        except ReferenceError_ as e:
            upstream = [
                r.step_id
                for r in find_refs(value)
                if r.step_id is not None and not self.steps[r.step_id].ok
            ]
            if upstream:
                return Ended(
                    StepResult(
                        status="skipped",
                        error_message=f"field {field_name!r}: step {upstream[0]!r} has no outputs",
                    )
                )
            return Ended(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.INVALID_INPUT.value,
                    error_message=f"step {step.id!r}: field {field_name!r}: {e}",
                )
            )

    def admit(self, worker: WorkerSpec, timeout: float | None, calls: int = 1) -> Admission | Ended:
        """The budget's admission for a step's call(s); a refusal ends the run
        ``budget_exhausted``."""
        try:
            return self.ledger.admit(worker, now(), timeout, calls)
        except BudgetRefused as e:
            return self.budget_exhausted(e.resource, e.message)

    def budget_exhausted(self, resource: str, message: str) -> Ended:
        """A call the budget refused, as the step's end; the run ends ``budget_exhausted``."""
        self.terminal = "budget_exhausted"
        return Ended(
            StepResult(
                status="failed",
                error_code=ErrorCode.BUDGET_EXCEEDED.value,
                error_message=f"refused before scheduling: {message}",
                reasons=[{"resource": resource, "message": message}],
            )
        )
