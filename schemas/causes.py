"""Failures that name their cause: the pipeline's ``error`` and the chain behind it.

A failed pipeline's result carries one :class:`PipelineError`: the stable
``code`` and ``message`` of the step that failed first, that step's id, and
its ``cause``, the failures the step went through (newest first: the last
try with the validator's reasons, earlier tries of the validation loop, the
step's own worker before its fallback, the gate that blocked it, the items of
a for_each). A step's result keeps the same chain (``StepResult.cause``), so
every attempt's cause is reachable from the result without the Temporal
history. Pure data and text; no I/O.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from aiworker.schemas.base import Model

# A cause keeps the first reasons of its failure; the step's own ``reasons`` keep all.
MAX_CAUSE_REASONS = 20
# A step's chain keeps this many causes (the newest); the loop's tries are bounded anyway.
MAX_CAUSES = 12
# Rejected outputs kept as best-effort results: the newest tries that had outputs.
KEPT_OUTPUTS = 3


class ErrorCause(Model):
    """One failure behind an error: a try of a step, its gate, a for_each item."""

    code: str | None = Field(description="the failure's stable error code")
    message: str = Field(description="what went wrong, in one line")
    step: str | None = Field(default=None, description="the step it happened in, if another")
    worker: str | None = Field(default=None, description="the worker that failed")
    attempt: int | None = Field(
        default=None, description="the try of the step's validation loop (1-based)"
    )
    fallback: bool = Field(default=False, description="the try was the step's fallback worker")
    item: int | None = Field(default=None, description="the for_each item's index")
    reasons: list[dict[str, Any]] = Field(
        default_factory=list, description="the validator's or worker's reasons (the first 20)"
    )
    outputs: Any = Field(
        default=None,
        description="the outputs this try produced and the validator rejected (best effort; "
        "kept for the newest 3 tries)",
    )


class PipelineError(Model):
    """Why a pipeline did not succeed: the first failing step's code and message.

    ``step`` is null only when no step is to blame (the pipeline waited past
    its deadline for a concurrency slot; its ``output`` could not be resolved).
    """

    code: str = Field(description="the stable error code of the failing step")
    message: str = Field(description="what went wrong, in one line, naming the step")
    step: str | None = Field(default=None, description="the id of the step that failed first")
    cause: list[ErrorCause] = Field(
        default_factory=list, description="the failures behind it, newest first"
    )

    @classmethod
    def of_problems(cls, code: str, message: str, problems: list[str]) -> PipelineError:
        """The error of a pipeline that failed as a whole (an invalid spec): no step,
        each problem a cause."""
        return cls(
            code=code, message=message, cause=[ErrorCause(code=code, message=p) for p in problems]
        )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        # Results recorded before this shape (`{"code", "problems"}` or
        # `{"code", "message"}`) still decode, e.g. when a redrive reads one.
        if isinstance(data, dict) and "problems" in data and "message" not in data:
            problems = [str(p) for p in data.get("problems") or []]
            return {"code": data.get("code", "internal"), "message": "; ".join(problems)}
        return data


def summary(reasons: list[Any]) -> str:
    """The first reason as ``$.path: message`` (and how many more), or ``""``."""
    if not reasons:
        return ""
    first = reasons[0]
    if isinstance(first, dict):
        path = first.get("path") or first.get("field") or first.get("resource")
        text = str(first.get("message", ""))
        line = f"{path}: {text}" if path else text
    else:
        line = str(first)
    more = len(reasons) - 1
    return line + (f" (and {more} more)" if more else "")


def with_reasons(message: str, reasons: list[Any]) -> str:
    """``message`` followed by the first reason, when there is one."""
    first = summary(reasons)
    return f"{message}: {first}" if first else message


def coded(code: str | None, message: str | None) -> str:
    """``code: message``, once (an activity failure's message already starts with its code)."""
    text = message or ""
    if not code or text.startswith(f"{code}:"):
        return text or (code or "")
    return f"{code}: {text}" if text else code


def bounded(causes: list[ErrorCause]) -> list[ErrorCause]:
    """The newest :data:`MAX_CAUSES` causes, with outputs only on the newest
    :data:`KEPT_OUTPUTS` that have any and at most :data:`MAX_CAUSE_REASONS` reasons each."""
    out: list[ErrorCause] = []
    kept = 0
    for c in causes[:MAX_CAUSES]:
        update: dict[str, Any] = {}
        if len(c.reasons) > MAX_CAUSE_REASONS:
            update["reasons"] = c.reasons[:MAX_CAUSE_REASONS]
        if c.outputs is not None:
            if kept < KEPT_OUTPUTS:
                kept += 1
            else:
                update["outputs"] = None
        out.append(c.model_copy(update=update) if update else c)
    return out


def without_outputs(causes: list[ErrorCause]) -> list[ErrorCause]:
    """The chain without rejected outputs (the pipeline's error stays small;
    the step's result keeps them)."""
    return [c.model_copy(update={"outputs": None}) if c.outputs is not None else c for c in causes]
