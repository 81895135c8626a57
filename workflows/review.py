"""Human review of escalated steps: the ``review`` Workflow Update's state.

A step whose ``on_failure`` is ``escalate`` and that failed waits for a
decision (approve, with optional corrected outputs; reject; retry) until its
``review_timeout_seconds``. :class:`ReviewDesk` keeps which steps wait, with
the JSON Schema corrected outputs must match, and the decisions that arrived;
the Update's validator (:meth:`ReviewDesk.check`) refuses a decision nobody
waits for before it enters history. Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from jsonschema import Draft202012Validator
    from pydantic import ValidationError

    from aiworker.schemas.pipeline import ReviewDecision


@dataclass
class ReviewDesk:
    """Steps waiting for a human (step id -> schema of corrected outputs) and the
    decisions received for them."""

    awaiting: dict[str, Any] = field(default_factory=dict)
    decisions: dict[str, ReviewDecision] = field(default_factory=dict)

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
        if d.outputs is not None:
            if d.decision != "approve":
                raise ValueError("outputs come only with approve")
            errors = list(Draft202012Validator(self.awaiting[step]).iter_errors(d.outputs))
            if errors:
                first = errors[0]
                path = "$" + "".join(f"[{p!r}]" for p in first.absolute_path)
                raise ValueError(f"outputs fail step {step!r}'s schema at {path}: {first.message}")

    def accept(self, decision: dict[str, Any]) -> dict[str, Any]:
        """Record a checked decision; the Update's reply."""
        d = ReviewDecision.model_validate(decision)
        step = d.step or next(iter(sorted(self.awaiting)))
        self.decisions[step] = d
        return {"step": step, "decision": d.decision, "reviewer": d.reviewer}

    def open(self, step_id: str, schema: Any) -> None:
        """``step_id`` waits for a decision from now on (an old one is dropped)."""
        self.decisions.pop(step_id, None)
        self.awaiting[step_id] = schema

    async def wait(self, step_id: str, timeout_seconds: float) -> ReviewDecision | None:
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
