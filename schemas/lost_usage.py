"""Usage of attempts whose outcome is unknown: what the heartbeat details say.

An attempt whose worker process is killed, or that the server times out
before the worker's own deadline, never reports its usage. Every heartbeat
therefore names the attempt that sent it (``attempt``), whether that attempt
had ended (``final``: a failing attempt's last word) and what was settled
before it (``before``); whoever comes next (the next attempt in its worker,
``activities/usage.py``; the workflow when the last attempt timed out,
``workflows/calls.py``) books each attempt that ended without a final word at
an estimate of the most one attempt may consume (:func:`cover`). Pure code,
shared by activities and workflows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from aiworker.schemas.protocol import Usage

# The warning a result carries when it booked an attempt at its maximum.
USAGE_ESTIMATED = "usage_estimated"


@dataclass(frozen=True)
class LastBeat:
    """What the last heartbeat said of the attempt that sent it."""

    attempt: int
    final: bool
    before: Usage

    @classmethod
    def of(cls, doc: Any) -> LastBeat | None:
        """The marks of a heartbeat details object; None for details of a worker
        from before attempts were marked (trusted as they are)."""
        attempt = doc.get("attempt") if isinstance(doc, dict) else None
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            return None
        try:
            before = Usage.model_validate(doc.get("before") or {})
        except ValidationError:
            before = Usage()
        return cls(attempt, bool(doc.get("final")), before)


NOTHING_HEARD = LastBeat(0, True, Usage())


def most(a: Usage, b: Usage) -> Usage:
    """Each count the larger of ``a``'s and ``b``'s."""
    return Usage(
        input_tokens=max(a.input_tokens, b.input_tokens),
        output_tokens=max(a.output_tokens, b.output_tokens),
        external_calls=max(a.external_calls, b.external_calls),
        cached_input_tokens=max(a.cached_input_tokens, b.cached_input_tokens),
        cache_write_tokens=max(a.cache_write_tokens, b.cache_write_tokens),
        cost_usd=max(a.cost_usd, b.cost_usd),
    )


def cover(heard: Usage, last: LastBeat, through: int, estimate: Usage) -> tuple[Usage, list[int]]:
    """``heard`` (the usage the last heartbeat carried) with every attempt up to
    ``through`` that ended without a final word booked at ``estimate``, or at what
    it heartbeated if that is more; and the numbers of those attempts."""
    first = last.attempt + 1 if last.final else last.attempt
    usage, lost = heard, []
    for n in range(max(1, first), through + 1):
        if n == last.attempt:  # what it heartbeated is in ``heard`` already
            usage = most(usage, last.before + estimate)
        else:
            usage = usage + estimate
        lost.append(n)
    return usage, lost


def estimated_message(lost: list[int]) -> str:
    """The warning's message for the attempts booked at their maximum."""
    which = ", ".join(str(n) for n in lost)
    return (
        f"usage estimated: attempt outcome unknown (attempt {which} ended without "
        "reporting its usage, its worker process lost or timed out; booked at the "
        "most one attempt may consume)"
    )
