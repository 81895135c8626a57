"""How a step's tries add up, and how a step ends at a gate that did not pass.

:class:`Tally` collects what a step's calls consumed (Temporal attempts,
usage, validator runs) and each failed try, newest first, as the step's
``cause`` (:mod:`aiworker.schemas.causes`): the worker's own failure, the
validator's reasons with the outputs it rejected (the newest three kept as
best-effort results), the fallback's failure. It also gives the ``progress``
view of a running step, so attempts count as they happen. The step runner
(``steps``) drives it. Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.causes import ErrorCause, bounded, coded, summary, with_reasons
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import StepResult
    from aiworker.schemas.protocol import Usage

from aiworker.workflows.state import Ended


def gate_verdict(gate_id: str, gate: StepResult) -> Ended | None:
    """How a step ends whose gate did not pass (None: it passed), saying what the
    gate's validator said, or how the gate step itself ended."""
    outputs = gate.outputs if isinstance(gate.outputs, dict) else {}
    if gate.status == "succeeded" and outputs.get("valid") is True:
        return None
    reasons = list(outputs.get("errors") or gate.reasons)
    if gate.status != "succeeded":
        said = f"step {gate_id!r} ended {gate.status}"
        if gate.error_code:
            said += f": {coded(gate.error_code, gate.error_message)}"
        elif gate.error_message:
            said += f" ({gate.error_message})"
        code = gate.error_code or ErrorCode.VALIDATION_FAILED.value
    elif "valid" not in outputs:
        said = f"step {gate_id!r} gave no 'valid' in its outputs (is it a validator step?)"
        code = ErrorCode.VALIDATION_FAILED.value
    else:
        said = with_reasons("its validator said valid: false", reasons)
        code = ErrorCode.VALIDATION_FAILED.value
    message = f"gate {gate_id!r} did not pass: {said}"
    cause = ErrorCause(code=code, message=said, step=gate_id, reasons=reasons)
    return Ended(
        StepResult(
            status="blocked",
            error_code=ErrorCode.VALIDATION_FAILED.value,
            error_message=message,
            reasons=reasons,
            cause=bounded([cause, *gate.cause]),
        )
    )


@dataclass
class Tally:
    """What a step's calls add up to: Temporal attempts, usage, validator runs,
    and the failed tries (newest first) that become the step's ``cause``."""

    attempts: int = 0
    usage: Usage = field(default_factory=Usage)
    validations: int = 0
    causes: list[ErrorCause] = field(default_factory=list)

    def add(self, result: StepResult) -> None:
        self.attempts += result.attempts
        self.usage = self.usage + result.usage

    def failed_try(
        self, result: StepResult, worker: str, attempt: int | None, fallback: bool = False
    ) -> None:
        """Keep a failed try (with the outputs the validator rejected, if any)."""
        cause = ErrorCause(
            code=result.error_code,
            message=result.error_message or f"ended {result.status}",
            worker=worker,
            attempt=attempt,
            fallback=fallback,
            reasons=result.reasons,
            outputs=result.outputs,
        )
        self.causes = bounded([cause, *self.causes])

    def running(self, in_flight: int) -> StepResult:
        """What ``progress`` shows while the step runs: ``in_flight`` is the call
        under way (1) or none (0, the validator runs)."""
        return StepResult(
            status="running",
            attempts=self.attempts + in_flight,
            usage=self.usage,
            validation_attempts=self.validations,
            cause=self.causes,
        )

    def succeeded(self, call: StepResult) -> StepResult:
        """The step's result from the call that produced its outputs."""
        return call.model_copy(
            update={
                "attempts": self.attempts,
                "usage": self.usage,
                "validation_attempts": self.validations,
                "cause": self.causes,
            }
        )

    def failed(self, last: StepResult | None, fallback_used: bool) -> StepResult:
        """The step's result when no call produced acceptable outputs."""
        final = last or StepResult(status="failed", error_code=ErrorCode.INTERNAL.value)
        return StepResult(
            status="failed",
            attempts=self.attempts,
            error_code=final.error_code,
            error_message=final.error_message,
            reasons=final.reasons,
            # the failed call's own (its usage estimated for a lost attempt, say)
            warnings=final.warnings,
            usage=self.usage,
            validation_attempts=self.validations,
            fallback_used=fallback_used,
            cause=self.causes,
        )

    def ended(self, ended: Ended, worker: str) -> Ended:
        """A step that ends before a call (budget, limits), keeping the tries so far."""
        r = ended.result
        if not self.causes or r.error_code is None:
            return ended
        own = ErrorCause(code=r.error_code, message=r.error_message or r.status, worker=worker)
        return Ended(r.model_copy(update={"cause": bounded([own, *self.causes])}))


def after_primary(
    fallback: str, result: StepResult, worker: str, primary: StepResult | None
) -> StepResult:
    """A failed fallback's result, its message naming the step's own worker's failure too."""
    message = f"fallback {fallback!r} failed: {result.error_message}"
    if primary is not None and primary.error_code is not None:
        said = coded(primary.error_code, primary.error_message or summary(primary.reasons))
        message += f"; before it, {worker!r} failed: {said}"
    return result.model_copy(update={"error_message": message})
