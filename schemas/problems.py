"""One problem of a pipeline spec: which step, which field and JSON path, what, and a fix.

Every check of a pipeline (:mod:`~aiworker.schemas.pipeline_check`,
:mod:`~aiworker.schemas.step_inputs`, the settings' part in
``aiworker.workers.pipeline_settings``) reports :class:`Problem` values; their
one-line form is what ``aiworker check``, ``aiworker run`` and the workflow's
``invalid_input`` say::

    step 'scrape': field 'input.extraction_spec.fields.price.selectr': unknown key
    (did you mean 'selector'?)

and :meth:`Problem.to_json` the form of ``aiworker check --json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.schemas.messages import with_suggestion


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


__all__ = ["Problem"]
