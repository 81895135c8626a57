"""The DAG scheduler: start every step whose dependencies are done, as they finish.

A step's dependencies are its ``depends_on``, its gate and the steps its
references name (:func:`step_dependencies`). Each round starts what is ready
and waits for at least one running step, so the loop is counted. A step that
fails with ``on_failure`` other than ``continue``, or one that ends the run
(``PipelineRun.terminal``), stops new starts; running steps finish. With
``resume_from`` (a redrive), the steps
:func:`~aiworker.workflows.redrive.plan_redrive` names are reused instead of run
(each succeeded before, with all its dependencies reused), and the result's
``redrive`` says what was reused and what ran again. The run's status follows
from the steps; the pipeline's ``output`` is resolved last. A run that did not
succeed names its cause in ``error``: the first step to fail, in the order
steps finished, with its code, message and cause chain; an ``output`` entry
that cannot be resolved is a warning, never the error. Deterministic code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.causes import PipelineError
    from aiworker.schemas.pipeline import (
        PipelineResult,
        Step,
        StepResult,
        TerminalStatus,
        step_dependencies,
        token_dependencies,
    )
    from aiworker.schemas.refs import ReferenceError_, resolve
    from aiworker.workflows.redrive import plan_redrive

from aiworker.workflows.state import PipelineRun
from aiworker.workflows.steps import run_step


@dataclass
class Schedule:
    """Where the DAG stands: finished steps, running ones, whether new starts stop."""

    deps: dict[str, set[str]]
    # wait steps a step needs only the tokens of (it may run while they wait)
    tokens: dict[str, set[str]] = field(default_factory=dict)
    issued: Collection[str] = ()
    done: set[str] = field(default_factory=set)
    running: dict[str, asyncio.Task[StepResult]] = field(default_factory=dict)
    failed_hard: bool = False
    finished: list[str] = field(default_factory=list)  # in the order steps finished

    def ready(self, step: Step) -> bool:
        return (
            step.id not in self.done
            and step.id not in self.running
            and self.deps[step.id] <= self.done
            and all(t in self.done or t in self.issued for t in self.tokens.get(step.id, ()))
        )

    def held_by_tokens(self) -> bool:
        """Some step not started waits only for a wait step's tokens."""
        return any(
            sid not in self.done and sid not in self.running and not self.ready_by_tokens(sid)
            for sid in self.tokens
        )

    def ready_by_tokens(self, sid: str) -> bool:
        return all(t in self.done or t in self.issued for t in self.tokens[sid])


async def run_dag(run: PipelineRun) -> PipelineResult:
    """Run every step of the pipeline; the pipeline's result."""
    spec = run.spec
    by_id = {s.id: s for s in spec.steps}
    # Only a pipeline with wait steps has token dependencies.
    sched = Schedule(
        deps=step_dependencies(spec),
        tokens=token_dependencies(spec),
        issued=run.board.callbacks.issued,
    )
    if spec.resume_from is not None:
        run.redrive = plan_redrive(spec)
    try:
        # Each round finishes at least one step (or a wait step handed out its
        # tokens, once per wait step), so this loop is bounded.
        for _ in range(3 * len(spec.steps) + 2):
            if not sched.failed_hard and run.terminal is None:
                reused = _start_ready(run, sched)
                if reused:
                    # Makes the reuse visible in this run's history and in the UI.
                    workflow.upsert_memo({"reused_steps": sorted(reused)})
                    if not sched.running:
                        continue
            if not sched.running:
                if all(s.id in sched.done for s in spec.steps) or sched.failed_hard or run.terminal:
                    break
                continue
            waits: list[asyncio.Task[Any]] = list(sched.running.values())
            tokens = None
            if sched.tokens and sched.held_by_tokens():
                # wake when a wait step hands out its tokens (no command, no event)
                n = len(run.board.callbacks.issued)
                tokens = asyncio.create_task(
                    workflow.wait_condition(lambda: len(run.board.callbacks.issued) != n)  # noqa: B023
                )
                waits.append(tokens)
            finished, _ = await workflow.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if tokens is not None and not tokens.done():
                tokens.cancel()
            for sid in [sid for sid, t in sched.running.items() if t in finished]:
                result = sched.running.pop(sid).result()
                run.steps[sid] = result
                sched.done.add(sid)
                sched.finished.append(sid)
                if result.status == "failed" and by_id[sid].on_failure != "continue":
                    sched.failed_hard = True
    except asyncio.CancelledError:
        for sid, task in sched.running.items():
            task.cancel()
            run.steps[sid] = run.steps[sid].model_copy(update={"status": "cancelled"})
        await asyncio.gather(*sched.running.values(), return_exceptions=True)
        for s in spec.steps:
            if run.steps[s.id].status == "pending":
                run.steps[s.id] = StepResult(status="cancelled")
        raise
    status = _status(run, sched)
    for step in spec.steps:
        if run.steps[step.id].status == "pending":
            run.steps[step.id] = StepResult(
                status="skipped", error_message=f"not run: the pipeline ended {status}"
            )
    failed = await run.materialize(list(spec.output.values()), "output")
    output, problems = _output(run)
    if failed is not None:
        problems.insert(0, {"field": "output", "message": failed.error_message or "failed"})
    warnings = [{"code": "output_incomplete", **p} for p in problems]
    error = None if status == "succeeded" else _error(run, sched.finished)
    if error is None and problems:
        # Nothing failed, yet the output is not whole: that is the error.
        error = PipelineError(
            code="output_incomplete",
            message="; ".join(f"{p['field']}: {p['message']}" for p in problems),
        )
    return PipelineResult(
        status=status,
        output=output,
        steps=dict(run.steps),
        usage=run.ledger.used,
        trace_id=run.trace_id,
        error=error,
        warnings=warnings,
        redrive=run.redrive.summary() if run.redrive else None,
    )


def _start_ready(run: PipelineRun, sched: Schedule) -> list[str]:
    """Start (or, when redriven, reuse) every ready step; the ids reused."""
    resume = run.spec.resume_from
    reused: list[str] = []
    for step in run.spec.steps:
        if not sched.ready(step):
            continue
        old = resume.steps.get(step.id) if resume else None
        reuse = run.redrive is not None and step.id in run.redrive.reused
        if old is not None and reuse and resume:
            run.steps[step.id] = old.model_copy(update={"reused_from": resume.workflow_id})
            reused.append(step.id)
            sched.done.add(step.id)
            continue
        run.steps[step.id] = StepResult(status="running")
        sched.running[step.id] = asyncio.create_task(run_step(run, step))
    return reused


def _status(run: PipelineRun, sched: Schedule) -> TerminalStatus:
    if run.terminal is not None:
        return run.terminal
    if sched.failed_hard:
        return "failed"
    if any(r.status in ("failed", "partial", "blocked", "rejected") for r in run.steps.values()):
        return "partial"
    return "succeeded"


def _error(run: PipelineRun, finished: list[str]) -> PipelineError | None:
    """The first step, in the order steps finished, that failed (or was blocked,
    rejected, timed out in review, or ended partial): its error."""
    for sid in finished:
        r = run.steps[sid]
        if r.status in _FAILED or (r.status == "partial" and r.error_code):
            return r.as_error(sid)
    for sid, r in run.steps.items():  # cancelled, or never finished
        if r.status in _FAILED:
            return r.as_error(sid)
    return None


_FAILED = ("failed", "blocked", "rejected", "escalation_timed_out")


def _output(run: PipelineRun) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The pipeline's ``output`` resolved, and what could not be
    (``{"field": "output.<key>", "message"}`` each)."""
    out: dict[str, Any] = {}
    missing: list[dict[str, str]] = []
    scope = run.scope()
    for key, value in run.spec.output.items():
        try:
            out[key] = resolve(value, scope, budget=run.size_budget())
        except ReferenceError_ as e:
            missing.append({"field": f"output.{key}", "message": str(e)})
    return out, missing
