"""Human review of escalated steps: the ``review`` Workflow Update's state.

A step whose ``on_failure`` is ``escalate`` and that failed waits for a
decision (approve, with optional corrected outputs; reject; retry) until its
``review_timeout_seconds``. :class:`ReviewDesk` keeps which steps wait, with
the contracts corrected outputs must meet (the worker's ``output_schema`` and
the step's ``validate.schema`` when set, with format checks, through
:mod:`~aiworker.schemas.safe_schema`), and the decisions that arrived. The
Update's validator (:meth:`ReviewDesk.check`) refuses, before anything enters
history, a decision nobody waits for, outputs off a contract, and an approval
without outputs of a step that produced none. Each accepted decision is kept
with the Update's id (``workflow.current_update_info()``), which is also how
the Update's accepted event, with the caller's client identity, is found in
the history: the free-text ``reviewer`` is only what the caller says (the
Update's id when it says nothing). The record names the step decided on even
when the caller did not, and when (workflow time). Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from aiworker.schemas import safe_schema
    from aiworker.schemas.pipeline import ReviewDecision


@dataclass(frozen=True)
class Awaiting:
    """A step waiting for review: the contracts its outputs must meet, each with
    the name a refusal gives it, and whether the step has outputs to approve."""

    contracts: tuple[tuple[str, Any], ...]
    has_outputs: bool


@dataclass(frozen=True)
class Decided:
    """An accepted decision (its ``step`` filled in), the id of the Update that
    brought it and when it arrived (ISO 8601, workflow time)."""

    decision: ReviewDecision
    update_id: str
    at: str = ""

    def record(self) -> dict[str, Any]:
        """What the step's result keeps of the review (not the outputs):
        ``decision``, ``reviewer``, ``note``, ``step``, ``update_id``, ``at``."""
        return {
            **self.decision.model_dump(mode="json", exclude={"outputs"}),
            **self.identity(),
            "at": self.at,
        }

    def identity(self) -> dict[str, Any]:
        # Who decided: what the caller said, else the one id the history can resolve.
        reviewer = self.decision.reviewer or f"update {self.update_id}"
        return {"reviewer": reviewer, "update_id": self.update_id}


@dataclass
class ReviewDesk:
    """Steps waiting for a human and the decisions received for them."""

    awaiting: dict[str, Awaiting] = field(default_factory=dict)
    decisions: dict[str, Decided] = field(default_factory=dict)

    def check(self, decision: dict[str, Any]) -> None:
        """The Update's validator: raise ``ValueError`` for a decision to refuse."""
        try:
            d = ReviewDecision.model_validate(decision)
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"invalid review: {first['msg']} at {first['loc']}") from None
        if not self.awaiting:
            raise ValueError("no step is awaiting review")
        if d.step is not None and d.step not in self.awaiting:
            raise ValueError(
                f"step {d.step!r} is not awaiting review (waiting: {sorted(self.awaiting)})"
            )
        if d.step is None and len(self.awaiting) > 1:
            raise ValueError(f"several steps await review, name one of {sorted(self.awaiting)}")
        step = d.step or next(iter(self.awaiting))
        if step in self.decisions:
            raise ValueError(f"step {step!r} already has a decision")
        waiting = self.awaiting[step]
        if d.outputs is None:
            if d.decision == "approve" and not waiting.has_outputs:
                raise ValueError(
                    f"step {step!r} produced no outputs: an approval must give them (outputs)"
                )
            return
        if d.decision != "approve":
            raise ValueError("outputs come only with approve")
        for name, schema in waiting.contracts:
            try:
                errors = safe_schema.errors(safe_schema.validator(schema), d.outputs)
            except safe_schema.SchemaError as e:
                raise ValueError(f"outputs cannot be checked against {name}: {e.message}") from None
            if errors:
                worst = min(errors, key=lambda e: list(map(str, e.absolute_path)))
                path = "$" + "".join(f"[{p!r}]" for p in worst.absolute_path)
                raise ValueError(
                    f"outputs fail step {step!r}'s schema ({name}) at {path}: {worst.message}"
                )

    def accept(self, decision: dict[str, Any]) -> dict[str, Any]:
        """Record a checked decision; the Update's reply."""
        d = ReviewDecision.model_validate(decision)
        step = d.step or next(iter(sorted(self.awaiting)))
        info = workflow.current_update_info()  # set in every update handler
        at = workflow.now().isoformat(timespec="milliseconds")
        decided = Decided(d.model_copy(update={"step": step}), info.id if info else "", at)
        self.decisions[step] = decided
        return {"step": step, "decision": d.decision, **decided.identity()}

    def open(self, step_id: str, contracts: list[tuple[str, Any]], has_outputs: bool) -> None:
        """``step_id`` waits for a decision from now on (an old one is dropped)."""
        self.decisions.pop(step_id, None)
        self.awaiting[step_id] = Awaiting(tuple(contracts), has_outputs)

    async def wait(self, step_id: str, timeout_seconds: float) -> Decided | None:
        """The decision on ``step_id``, or None if none came in time."""
        try:
            await workflow.wait_condition(
                lambda: step_id in self.decisions,
                timeout=timedelta(seconds=timeout_seconds),
                timeout_summary=f"review deadline of {step_id}",
            )
        except TimeoutError:
            return None
        finally:
            self.awaiting.pop(step_id, None)
        return self.decisions.pop(step_id)
