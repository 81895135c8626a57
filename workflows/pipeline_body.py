"""What ``PipelineWorkflow`` does: runs a pipeline spec as a DAG of worker calls.

The spec arrives as plain JSON and is checked whole before the first step
runs; a bad spec fails the workflow with a non-retryable ``invalid_input``
naming the step and field. Then, step by step as dependencies finish:

- ``when`` false -> ``skipped``; a ``gate`` whose validator did not pass ->
  ``blocked`` with ``validation_failed`` and the validator's reasons.
- The budget ledger admits the step or refuses it with ``budget_exceeded``
  before anything is scheduled (the pipeline ends ``budget_exhausted``).
- A single step runs the bounded loop: run -> validate (the ``validator``
  worker) -> run again with the reasons in ``feedback`` ... up to
  ``validate.max_attempts`` -> the ``fallback`` worker -> ``on_failure``.
- ``escalate`` waits for the ``review`` Workflow Update (approve, reject,
  retry) until ``review_timeout_seconds``; no answer ends the pipeline
  ``escalation_timed_out``. Review rounds are counted too.
- A ``for_each`` step runs its items in child workflows of ``chunk_size``
  items (``workflows.foreach``), so histories stay bounded.
- ``resume_from`` (set by ``aiworker redrive``) reuses the outputs of steps
  that succeeded in an earlier run and keeps that run's idempotency keys.

A run that ends ``succeeded`` or ``partial`` completes with its result; any
other terminal status fails the workflow execution with an ``ApplicationError``
whose type is the stable error code and whose details carry the result
(:mod:`~aiworker.schemas.outcomes`); a cancelled run is a cancelled execution.

Every status change is upserted to the ``AiworkerStatus`` search attribute;
the ``progress`` query shows per-step status, attempts, error code, duration
and usage. Deterministic code only: no I/O, clock, randomness or telemetry
libraries.

This module holds the workflow's handlers and its top-level run in
:class:`PipelineBody`; ``workflows/pipeline.py`` holds only the definition the
SDK loads, ``PipelineWorkflow(PipelineBody)``. The sandbox imports a workflow's
own module again for every run, and with the handlers' decorators (each
resolving its type hints) that import was the largest single cost of a short
pipeline's worker CPU after Temporal's own; a helper module is shared with
every run (``SHARED_WORKFLOW_MODULES``), so the decorators run once per process.
The parts the run uses each have a module and work on one
:class:`~aiworker.workflows.state.PipelineRun`:

- ``dag``: the scheduler (ready steps, reuse on redrive, the final status);
- ``steps``: the step runner (preflight, attempt -> validate -> feedback ->
  fallback -> review);
- ``fanout``: for_each in child workflows (``foreach``);
- ``review``: the ``review`` Update's desk;
- ``pipeline_limits``: the pipeline's limits (``limits`` holds the permit
  protocol and the limiter);
- ``budget``: the ledger and the deadline; ``calls``: one worker call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic.main import IncEx

    from aiworker.schemas import names
    from aiworker.schemas.caps import Caps
    from aiworker.schemas.causes import PipelineError
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import RunConfig
    from aiworker.schemas.outcomes import completes, pipeline_failure
    from aiworker.schemas.pipeline import PipelineResult, PipelineSpec, StepResult
    from aiworker.schemas.pipeline_check import PipelineSpecError, cap_problems, parse_model
    from aiworker.schemas.priority import task_priority
    from aiworker.schemas.protocol import TraceContext, Usage
    from aiworker.schemas.recorded import named_workers, open_tools
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Ledger
from aiworker.workflows.calls import (
    PAYLOAD_DECODE_ERRORS,
    error_code_of,
    failure_text,
    invalid_input,
)
from aiworker.workflows.dag import run_dag
from aiworker.workflows.limits import PermitSignals
from aiworker.workflows.pipeline_limits import PipelineLimits
from aiworker.workflows.runs import in_run
from aiworker.workflows.state import Board, PipelineRun, now, search_attributes_on

_STABLE_CODES = frozenset(c.value for c in ErrorCode)


def _no_outputs() -> dict[str, IncEx | bool]:
    """What ``progress`` leaves out unless asked: outputs, and the rejected outputs
    a cause keeps (a new dict each time: this module is shared by every run)."""
    return {"outputs": True, "cause": {"__all__": {"outputs"}}}


__all__ = [
    "PipelineBody",
    "error_code_of",
    "invalid_input",
    "recorded_workers",
]


def _parsed(raw: Any) -> PipelineSpec:
    """The pipeline model of ``raw`` within the hard ceilings, as ``invalid_input``
    otherwise: all the workflow task checks itself, so that what it holds in memory
    is bounded. The check of the pipeline as a whole (workers, references, schemas,
    patterns, the process's caps) is the run-config local activity's
    (``RunConfig.problems``), whose answer is in the history: a pipeline full of
    schemas and patterns once held the workflow task past the SDK's deadlock
    detector (TMPRL1101), and one check per run is enough."""
    try:
        spec = parse_model(raw)
    except PipelineSpecError as e:
        raise invalid_input(str(e), e.problems) from None
    if found := cap_problems(spec, Caps.ceilings()):
        problems = [str(p) for p in found]
        raise invalid_input("invalid pipeline: " + "; ".join(problems), problems)
    return spec


def recorded_workers(run_config: RunConfig) -> Mapping[str, WorkerSpec]:
    """The specs the run config recorded, once the pipeline passed its check
    against them (``problems``: an unknown worker named with every worker the
    answering process knows, a step input its worker's contract refuses, a
    reference into an output its shape lacks, the process's caps), else
    ``invalid_input`` naming every problem."""
    if run_config.problems:
        problems = run_config.problems
        raise invalid_input("invalid pipeline: " + "; ".join(problems), problems)
    return run_config.specs


class PipelineBody(PermitSignals):
    """A pipeline run's handlers and its run (``run_pipeline``), for
    ``PipelineWorkflow`` to define: a DAG of AI worker steps with references
    between them. Every ``@workflow.query`` and ``@workflow.update`` here is the
    workflow's own; its ``@workflow.run`` must be declared on the workflow class
    itself (the SDK's rule), which calls :meth:`run_pipeline`."""

    def __init__(self) -> None:
        # What the handlers see, from the first moment; the run once the spec is checked.
        self._board = Board()
        self._permits = self._board.permits
        self._run: PipelineRun | None = None

    # -- queries and updates -------------------------------------------------

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self, include_outputs: bool = False) -> dict[str, Any]:
        """Per-step status, attempts, error code, duration and usage so far."""
        board = self._board
        exclude = None if include_outputs else _no_outputs()
        waiting = board.permits.waiting_for()
        steps = {k: v.model_dump(mode="json", exclude=exclude) for k, v in board.steps.items()}
        for step_id in waiting.keys() & steps.keys():
            steps[step_id]["status"] = "waiting"
        for step_id in board.external.keys() & steps.keys():
            steps[step_id]["external_worker"] = board.external[step_id]
        ledger = self._run.ledger if self._run else None
        return {
            "status": board.status,
            "steps": steps,
            # who waits at a limiter now: step id ("" for the pipeline) -> rate or concurrency
            "waiting": waiting,
            # and which limit each waits for, with its configured rate
            "limits": board.permits.waiting_limits(),
            "usage": (ledger.used if ledger else Usage()).model_dump(mode="json"),
            "budget": ledger.view() if ledger else None,
            "awaiting_review": sorted(board.desk.awaiting),
            # wait steps' tokens still waiting: step, item (for_each), timeout_at
            "awaiting_callback": board.callbacks.waiting(),
        }

    @workflow.query(name=names.EVENTS_QUERY)
    def events(self, after: int = 0) -> dict[str, Any]:
        """The run's numbered step events after ``after`` (workflows.step_events)."""
        return self._board.events.answer(after, self._board.status)

    @workflow.update(name=names.REVIEW_UPDATE)
    async def review(self, decision: dict[str, Any]) -> dict[str, Any]:
        """A human decision on an escalated step: approve, reject or retry."""
        return self._board.desk.accept(decision)

    @review.validator
    def _check_review(self, decision: dict[str, Any]) -> None:
        self._board.desk.check(decision)

    @workflow.update(name=names.CALLBACK_UPDATE)
    async def callback(self, request: dict[str, Any]) -> dict[str, Any]:
        """Complete, fail or extend a wait step's token (``aiworker callback``)."""
        return self._board.callbacks.accept(request)

    @callback.validator
    def _check_callback(self, request: dict[str, Any]) -> None:
        self._board.callbacks.check(request)

    @workflow.query(name=names.CALLBACK_QUERY)
    def callback_state(self, token: str) -> dict[str, Any]:
        """What became of a token (also after the run ended): ``known``, ``state``,
        ``answer`` (a hash of the accepted answer) and the first ``reply``."""
        return self._board.callbacks.lookup(token)

    # -- the run -------------------------------------------------------------

    async def run_pipeline(self, pipeline: Any) -> PipelineResult:
        """Run the pipeline; the argument is the pipeline JSON users write.

        Typed ``Any`` on purpose: the JSON is checked here, so that malformed
        input fails the workflow with ``invalid_input`` instead of failing
        payload decoding, which would retry the workflow task forever.

        Returns the result when the run ends ``succeeded`` or ``partial``. Any
        other terminal status fails the execution with the ``ApplicationError``
        of :func:`~aiworker.schemas.outcomes.pipeline_failure` (its type the
        error code, its details the result); a cancelled run is a cancelled
        execution.
        """
        board = self._board
        try:
            spec = _parsed(pipeline)
        except ApplicationError as e:
            board.set_status("failed", e.type)
            raise
        run = self._run = self._start(spec)
        try:
            run_config = await run.limits.load_run_config(
                spec, named_workers(spec), open_tools(spec), pipeline
            )
            run.workers = recorded_workers(run_config)
            run.limits.hold_to_tenant(spec, run.ledger)
            policy = run_config.tenant
            run.priority = task_priority(
                workflow.info().priority,
                spec.priority,
                spec.tenant,
                policy.fairness_weight if policy is not None else None,
            )
            slot = await run.limits.pipeline_slot(spec)
            if isinstance(slot, str):
                result = self._not_run(run, slot)
            else:
                if spec.concurrency is not None:
                    board.set_status("running")  # the slot came: no longer "waiting"
                try:
                    result = await run_dag(run)
                finally:
                    await run.limits.permits.release_all(slot)
        except asyncio.CancelledError:
            self._finish("cancelled", spec)
            raise
        except ApplicationError as e:
            self._finish("failed", spec, e.type)
            raise
        except FailureError as e:
            # An engine activity that failed on every attempt (the run config, a
            # limiter ask, the callback tokens): an outcome Temporal reports, not a
            # bug in this code. The run fails with the activity's stable code
            # (``internal`` when the activity itself crashed).
            code = error_code_of(e)
            code = code if code in _STABLE_CODES else ErrorCode.INTERNAL.value
            cause = e.cause if isinstance(e, ActivityError) and e.cause is not None else e
            self._finish("failed", spec, code)
            raise ApplicationError(
                f"pipeline: {failure_text(cause)}", type=code, non_retryable=True
            ) from e
        # No catch-all: an unexpected exception here is a bug in this code, and it
        # fails the workflow task (AiworkerPlugin's workflow_failure_exception_types):
        # the run waits, the alert on workflow-task failures fires, and a fixed build
        # resumes it from its history with every step done so far kept.
        self._finish(result.status, spec, result.error.code if result.error else None)
        if not completes(result.status):
            # A run that did not succeed is a failed execution, its result in the details.
            raise pipeline_failure(result)
        return result

    def _start(self, spec: PipelineSpec) -> PipelineRun:
        """The run's state, its search attributes and every step pending."""
        info = workflow.info()
        # The real trace (from the SDK's tracing interceptor) when there is one,
        # so the result's trace_id finds the pipeline in the trace backend. The
        # uuid4() is drawn either way: later ids must not shift on replay.
        generated = workflow.uuid4().hex
        started_in = _trace_of(info)
        ledger = Ledger(spec.budget, started_at=now())
        run = PipelineRun(
            spec=spec,
            workers={},
            board=self._board,
            ledger=ledger,
            # only a redrive that set new_keys (a new field) takes this run's id
            key_base=(
                spec.resume_from.workflow_id
                if spec.resume_from and not spec.resume_from.new_keys
                else info.workflow_id
            ),
            queue_suffix=names.queue_suffix_of(info.task_queue),
            trace_id=started_in.trace_id if started_in else generated,
            limits=PipelineLimits(
                permits=self._board.permits,
                requester=info.workflow_id,
                tenant=spec.tenant,
                deadline=ledger.ends,
            ),
        )
        # one upsert for all three: each is a visibility write on the server
        self._board.status = "running" if spec.concurrency is None else "waiting"
        if search_attributes_on():
            workflow.upsert_search_attributes(
                [
                    names.TENANT_KEY.value_set(spec.tenant),
                    names.PIPELINE_KEY.value_set(spec.name),
                    names.STATUS_KEY.value_set(self._board.status),
                ]
            )
        for step in spec.steps:
            run.steps[step.id] = StepResult(status="pending")
        # the Temporal UI's view of the DAG (no command, no history event)
        self._board.table.start(
            spec.name, {s.id: s.worker or "wait" for s in spec.steps}, self._board.status
        )
        return run

    @staticmethod
    def _not_run(run: PipelineRun, message: str) -> PipelineResult:
        """The pipeline's deadline passed while it waited for its concurrency slot."""
        for sid in run.steps:
            run.steps[sid] = StepResult(status="skipped", error_message=message)
        return PipelineResult(
            status="failed",
            steps=dict(run.steps),
            usage=Usage(),
            trace_id=run.trace_id,
            error=PipelineError(code=ErrorCode.RATE_LIMITED.value, message=message),
        )

    def _finish(self, status: str, spec: PipelineSpec, error_code: str | None = None) -> None:
        if not in_run(self._board.run_id):
            return  # a dropped run closed by the collector ends nothing (workflows.runs)
        self._board.set_status(status, error_code)
        counter = workflow.metric_meter().create_counter(
            "aiworker_pipelines", "Pipelines that reached a terminal status."
        )
        counter.add(1, {"status": status, "pipeline": spec.name, "tenant": spec.tenant})


def _trace_of(info: workflow.Info) -> TraceContext | None:
    """The W3C trace context the workflow was started in (from its headers), if any."""
    payload = info.headers.get(names.TRACE_HEADER)
    if payload is None:
        return None
    try:
        carrier = workflow.payload_converter().from_payloads([payload])[0]
    except PAYLOAD_DECODE_ERRORS:  # a caller's header: not ours to trust
        return None
    if not isinstance(carrier, dict):
        return None
    return TraceContext.from_traceparent(carrier.get("traceparent"))
