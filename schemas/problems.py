"""One problem of a pipeline spec: which step, which field and JSON path, what, and a fix.

Every check of a pipeline (:mod:`~aiworker.schemas.pipeline_check`,
:mod:`~aiworker.schemas.step_inputs`, the settings' part in
``aiworker.workers.process.pipeline_settings``) reports :class:`Problem` values; their
one-line form is what ``aiworker check``, ``aiworker run`` and the workflow's
``invalid_input`` say::

    step 'scrape': field 'input.extraction_spec.fields.price.selectr': unknown key
    (did you mean 'selector'?)

and :meth:`Problem.to_json` the form of ``aiworker check --json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from aiworker.schemas.messages import json_path, pydantic_issues, with_suggestion
from aiworker.schemas.pipeline import PipelineSpec


@dataclass(frozen=True)
class Problem:
    """What is wrong, and where.

    Attributes:
        step: the step's id; None for the pipeline's own fields (or a step without one).
        at: the place inside the step (or the pipeline) as a JSON path without its
            root: ``input.extraction_spec.fields.price.selectr``, ``depends_on``;
            empty for the step (or the pipeline) as a whole.
        message: what is wrong, without the suggestion.
        suggestion: a close match for a misspelled key or name, if there is one.
        index: the step's position in ``steps``, for the JSON path.
    """

    step: str | None
    at: str
    message: str
    suggestion: str | None = None
    index: int | None = None

    @property
    def field(self) -> str:
        """The top-level field of the step (or pipeline) the problem is in."""
        for i, c in enumerate(self.at):
            if c in ".[":
                return self.at[:i]
        return self.at

    @property
    def path(self) -> str:
        """The JSON path from the pipeline's root: ``steps[0].input.url``."""
        if self.index is None:
            return self.at or "$"
        base = f"steps[{self.index}]"
        if not self.at:
            return base
        return base + (self.at if self.at.startswith("[") else f".{self.at}")

    @property
    def where(self) -> str:
        """``step 'a'``, ``step #2`` (a step without a valid id) or ``pipeline``."""
        if self.step is not None:
            return f"step {self.step!r}"
        if self.index is not None:
            return f"step #{self.index}"
        return "pipeline"

    def __str__(self) -> str:
        text = with_suggestion(self.message, self.suggestion)
        return f"{self.where}: field {self.at!r}: {text}" if self.at else f"{self.where}: {text}"

    def to_json(self) -> dict[str, Any]:
        """``{step, field, path, message, suggestion}`` (``message`` is the whole line)."""
        return {
            "step": self.step,
            "field": self.field or None,
            "path": self.path,
            "message": str(self),
            "suggestion": self.suggestion,
        }


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the pipeline format allows at ``loc`` (for a misspelled key's suggestion)."""
    model: Any = PipelineSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            field = next((f for f in model.model_fields.values() if f.alias == part), None)
        annotation = getattr(field, "annotation", None)
        inner = [annotation, *getattr(annotation, "__args__", ())]
        model = next((t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if model is None:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


def field_problems(raw: Any, e: ValidationError) -> list[Problem]:
    """pydantic's errors for the pipeline ``raw`` as problems in JSON terms, naming
    step and field, with a close key for an unknown one."""
    steps = raw.get("steps") if isinstance(raw, dict) else None
    problems = []
    for issue in pydantic_issues(e.errors(include_url=False), raw, _known_keys):
        loc, sid, index = issue.path, None, None
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            index = loc[1]
            if isinstance(steps, list) and index < len(steps) and isinstance(steps[index], dict):
                found = steps[index].get("id")
                sid = found if isinstance(found, str) and found else None
            loc = loc[2:]
        at = json_path(loc, "") or ("" if index is not None else "(root)")
        problems.append(Problem(sid, at, issue.message, issue.suggestion, index))
    return problems


__all__ = ["Problem", "field_problems"]
