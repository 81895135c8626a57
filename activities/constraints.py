"""The limits one worker call runs under: its spec's, tightened by the request.

A request may lower a worker's timeout, token cap and external-call quota, and
narrow its tool allow-list; it may never loosen them (that would let a caller
buy more than the worker's contract grants). :func:`tighten` is the runtime's
"enforce constraints" step.
"""

from __future__ import annotations

from aiworker.activities.errors import InvalidInputError
from aiworker.schemas.options import effective_timeout
from aiworker.schemas.protocol import RequestConstraints
from aiworker.schemas.spec import WorkerSpec


def tighten(spec: WorkerSpec, c: RequestConstraints) -> RequestConstraints:
    """Check that ``c`` only tightens ``spec``; ``invalid_input`` names the loosened field."""
    sc = spec.constraints
    if c.timeout_seconds is not None and c.timeout_seconds > sc.timeout_seconds:
        raise InvalidInputError(
            f"constraints.timeout_seconds={c.timeout_seconds} loosens the spec's "
            f"{sc.timeout_seconds}",
            field="constraints.timeout_seconds",
        )
    if c.max_tokens is not None and sc.max_tokens is not None and c.max_tokens > sc.max_tokens:
        raise InvalidInputError(
            f"constraints.max_tokens={c.max_tokens} loosens the spec's {sc.max_tokens}",
            field="constraints.max_tokens",
        )
    if c.tools_allowed is not None:
        extra = sorted(set(c.tools_allowed) - set(sc.tools_allowed))
        if extra:
            raise InvalidInputError(
                f"constraints.tools_allowed adds {extra} beyond the spec's {sc.tools_allowed}",
                field="constraints.tools_allowed",
            )
    if (
        c.max_external_calls is not None
        and sc.max_external_calls is not None
        and c.max_external_calls > sc.max_external_calls
    ):
        raise InvalidInputError(
            f"constraints.max_external_calls={c.max_external_calls} loosens the spec's "
            f"{sc.max_external_calls}",
            field="constraints.max_external_calls",
        )
    return RequestConstraints(
        timeout_seconds=effective_timeout(spec, c),
        max_tokens=min_optional(sc.max_tokens, c.max_tokens),
        tools_allowed=sorted(sc.tools_allowed if c.tools_allowed is None else c.tools_allowed),
        max_external_calls=min_optional(sc.max_external_calls, c.max_external_calls),
    )


def min_optional(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional limits (``None`` means no limit)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
