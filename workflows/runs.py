"""The run a workflow object belongs to, for code that may run outside it.

A worker that stops with runs in its cache drops them unfinished (the SDK's
safe eviction does not reach them), and the garbage collector closes their
coroutines later, on whatever thread it happens to run: each coroutine's
``finally`` blocks run there (a review's status reset, a lease release, the
terminal status). On a workflow task thread that is *another* run's task:
``workflow.in_workflow()`` is true and every SDK call acts on that run, so
an upsert or a signal to a limiter lands in a history that never asked for
it, and that run's next replay meets a command it cannot match (a
``SignalExternalWorkflowExecution`` where its history scheduled an activity;
``tests/workflows/test_abandoned_runs.py`` shows it). The objects whose
methods such blocks call remember the run that made them (:func:`this_run`)
and act only inside it (:func:`in_run`); the run itself goes on where it is
replayed, so nothing is lost.

The check reads the run id from the workflow's own info: the same in the
first execution and on every replay, so it adds no decision to a history.
"""

from __future__ import annotations

from temporalio import workflow


def this_run() -> str | None:
    """The run id of the workflow task running now (None outside any workflow)."""
    return workflow.info().run_id if workflow.in_workflow() else None


def in_run(run_id: str | None) -> bool:
    """True when the workflow task running now is ``run_id``'s own."""
    return run_id is not None and workflow.in_workflow() and workflow.info().run_id == run_id


__all__ = ["in_run", "this_run"]
