"""What a redrive reuses and what it runs again, decided from the spec alone.

A redrive (``resume_from``) starts a pipeline again with the step results of
an earlier run. :func:`plan_redrive` decides, the same way in the workflow and
in the CLI that announces it:

- a step is **reused** when it ``succeeded`` before and every step it depends
  on is reused too (a step downstream of one that runs again runs again, so a
  fixed input reaches the output);
- every other step **runs again**: ``partial``, ``failed``, ``skipped``,
  ``blocked``, ... and those downstream of them;
- a ``for_each`` step that runs again while its dependencies are reused keeps
  the outputs of the items that succeeded and runs only the others
  (:meth:`Redrive.kept_items`), as long as its list has as many items as before;
  an earlier ``outputs.items`` held by reference (:class:`ItemsRef`) is loaded
  by the workflow first (:meth:`Redrive.previous_items_ref`).

:class:`Redrive` also collects what the run did, for the result's ``redrive``
summary. No I/O; deterministic (the workflow uses it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiworker.schemas.pipeline import (
    ItemsRef,
    PipelineSpec,
    StepResult,
    step_dependencies,
    token_dependencies,
)


@dataclass
class Redrive:
    """A redrive's plan, and the items it ran again as it goes.

    Attributes:
        source: the first run's workflow id (idempotency keys keep using it).
        reused: the steps whose earlier results are reused, in spec order.
        rerun: the steps that run again, in spec order.
        previous: the earlier run's results of the steps that produced outputs.
        items_rerun: for_each step -> the item indexes run again (the rest kept).
    """

    source: str
    reused: list[str]
    rerun: list[str]
    previous: dict[str, StepResult]
    items_rerun: dict[str, list[int]] = field(default_factory=dict)

    def _earlier_items(self, step_id: str) -> Any:
        """The earlier run's ``outputs.items`` of ``step_id`` if its items may be kept."""
        old = self.previous.get(step_id)
        if old is None or step_id in self.reused or not isinstance(old.outputs, dict):
            return None
        return old.outputs.get("items")

    def previous_items_ref(self, step_id: str, count: int) -> ItemsRef | None:
        """The earlier run's ``outputs.items`` of for_each ``step_id`` when it is a
        reference to ``count`` items whose kept outputs the workflow must load."""
        ref = ItemsRef.of(self._earlier_items(step_id))
        return ref if ref is not None and ref.count == count else None

    def kept_items(
        self, step_id: str, count: int, loaded: list[Any] | None = None
    ) -> dict[int, Any]:
        """The outputs of the items of for_each ``step_id`` that succeeded before, by
        index; empty unless the step runs again over a list of ``count`` items
        resolved from reused steps only, as long as the earlier one. ``loaded``:
        the earlier items when they were held by reference (loaded by the workflow)."""
        items = loaded if loaded is not None else self._earlier_items(step_id)
        if not isinstance(items, list) or len(items) != count:
            return {}
        return {i: out for i, out in enumerate(items) if out is not None}

    def summary(self) -> dict[str, Any]:
        """The result's ``redrive``: what was reused, what ran again."""
        return {
            "from": self.source,
            "reused": self.reused,
            "rerun": self.rerun,
            "items_rerun": self.items_rerun,
        }


def plan_redrive(spec: PipelineSpec) -> Redrive | None:
    """The plan of a redriven spec (one with ``resume_from``); ``None`` otherwise."""
    resume = spec.resume_from
    if resume is None:
        return None
    deps = step_dependencies(spec)
    # A step that sent a wait step's token is reused only with that wait step: a
    # wait step that runs again hands out a new token, to be sent again.
    for sid, waits in token_dependencies(spec).items():
        deps[sid] = deps[sid] | waits
    reused: set[str] = set()
    # A step joins once all its dependencies have: at most one pass per step.
    for _ in range(len(spec.steps)):
        joined = {
            s.id
            for s in spec.steps
            if s.id not in reused
            and (old := resume.steps.get(s.id)) is not None
            and old.status == "succeeded"
            and deps[s.id] <= reused
        }
        if not joined:
            break
        reused |= joined
    # Item reuse needs the for_each list to come from reused results only.
    previous = {
        sid: r
        for sid, r in resume.steps.items()
        if sid in reused or (sid in deps and deps[sid] <= reused)
    }
    return Redrive(
        source=resume.workflow_id,
        reused=[s.id for s in spec.steps if s.id in reused],
        rerun=[s.id for s in spec.steps if s.id not in reused],
        previous=previous,
    )


def describe_redrive(pipeline: dict[str, Any]) -> str:
    """What a redrive input will reuse and run again, in words (``aiworker
    redrive`` prints it; the result's ``redrive`` says what the run did)."""
    try:
        plan = plan_redrive(PipelineSpec.model_validate(pipeline))
    except ValueError:  # the workflow says what is wrong with the spec
        plan = None
    if plan is None:
        return "see the result's redrive"

    def again(sid: str) -> str:
        old = plan.previous.get(sid)
        items = old.outputs.get("items") if old and isinstance(old.outputs, dict) else None
        if isinstance(items, list) and plan.kept_items(sid, len(items)):
            return f"{sid} (only its failed items)"
        ref = ItemsRef.of(items)
        if ref is not None and plan.previous_items_ref(sid, ref.count) is not None:
            return f"{sid} (only its failed items, if its list is as long)"
        return sid

    return (
        f"reusing {', '.join(plan.reused) or 'nothing'}; "
        f"running again {', '.join(again(s) for s in plan.rerun) or 'nothing'}"
    )
