"""The run's step events, numbered in the workflow: what the live event stream reads.

``GET /v1/pipelines/{id}/events`` (and the SDK's ``PipelineClient.events``)
must give every event an id that any ``serve`` process derives the same way,
so a client that reconnects with ``Last-Event-ID`` to another process misses
nothing and sees nothing twice. Serve's own memory cannot number them (a
process that restarts or another process behind the balancer has seen other
polls), so the workflow numbers them: :class:`StepEvents` notes every step
result the run writes (the :class:`~aiworker.workflows.details.StepBoard`'s
``on_set``, beside the UI's step table) and appends an event when a step's
row changes: ``step_started`` (it began running, or a wait step began waiting), ``step_progress``
(attempts or for_each items moved while it runs), ``review_awaited``,
``step_ended`` (a status of ``ENDED_STEP_STATUSES``). Event ``n`` is the
``n``-th such change of the run, with the history length of the workflow
task that made it (``history_length``).

The numbering is a pure function of the history: the same results are written
in the same order on every replay, so a worker that restarts (and replays)
answers the ``events`` query with the same numbers. ``history_length`` is the
one field that is not: a local activity's attempt that outlasted a workflow task
resolves in a later task live and at the scheduling task on replay (the SDK
reads its marker ahead), so that step's events may carry an earlier length when
an ended run is replayed to answer the query. It is workflow memory
only: no command, no history event, no search attribute, so it changes
neither the command sequence nor replay (the replay gate shows it).

Bounded: the run keeps its last :data:`MAX_KEPT` events (a query answers at
most :data:`MAX_ANSWER` of them at once, and says which is the first it still
has); a step's result is large only in its outputs, which an event never holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.names import ENDED_STEP_STATUSES
    from aiworker.schemas.pipeline import StepResult

from aiworker.workflows.details import Row, row_of
from aiworker.workflows.runs import in_run, this_run

# Events the run keeps (oldest dropped past this; the query names the first kept).
MAX_KEPT = 5000
# Events one `events` query answer carries (the stream asks again for the rest).
MAX_ANSWER = 500
# A step that has begun: it runs, or (a wait step) waits for its callback.
_ACTIVE = frozenset(("running", "waiting"))
# The error message an event carries is cut here (the result has it whole).
MAX_MESSAGE_CHARS = 500


def kind_of(old: Row | None, new: Row) -> str | None:
    """The event a step's row change is, or None (no event: still pending, or no change)."""
    status = new[0]
    if old == new or status == "pending":
        return None
    before = old[0] if old else "pending"
    if status in ENDED_STEP_STATUSES:
        return "step_ended" if before != status else None
    if status == "awaiting_review":
        return "review_awaited" if before != status else None
    if status in _ACTIVE:
        return "step_started" if before not in _ACTIVE else "step_progress"
    return "step_progress"


def event_of(kind: str, n: int, step_id: str, result: StepResult, length: int) -> dict[str, Any]:
    """One event: its number, type, step and the step's row (no outputs)."""
    doc: dict[str, Any] = {
        "n": n,
        "type": kind,
        "step": step_id,
        "status": result.status,
        "attempts": result.attempts,
        "history_length": length,
    }
    if result.items is not None:
        doc["items"] = dict(result.items)
    if kind == "step_ended":
        doc["duration_ms"] = result.duration_ms
        doc["cached"] = result.cached
        if result.error_code:
            doc["error_code"] = result.error_code
        if result.error_message:
            doc["error_message"] = result.error_message[:MAX_MESSAGE_CHARS]
    return doc


@dataclass
class StepEvents:
    """The run's numbered step events (see the module docstring)."""

    rows: dict[str, Row] = field(default_factory=dict)
    kept: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0
    run_id: str | None = field(default_factory=this_run)  # noted only inside this run

    def note(self, step_id: str, result: StepResult) -> None:
        """A step's result was written: an event when its row changed."""
        if not in_run(self.run_id):
            # a dropped run's coroutines closed by the garbage collector (workflows.runs)
            return
        row = row_of(result)
        kind = kind_of(self.rows.get(step_id), row)
        self.rows[step_id] = row
        if kind is None:
            return
        self.count += 1
        length = workflow.info().get_current_history_length()
        self.kept.append(event_of(kind, self.count, step_id, result, length))
        if len(self.kept) > MAX_KEPT:
            del self.kept[: len(self.kept) - MAX_KEPT]

    def answer(self, after: int, status: str) -> dict[str, Any]:
        """The ``events`` query's answer: the events numbered above ``after`` (at most
        :data:`MAX_ANSWER`), the run's event count, the first kept, the run's status."""
        first = self.kept[0]["n"] if self.kept else self.count + 1
        start = max(0, after + 1 - first)
        return {
            "events": self.kept[start : start + MAX_ANSWER],
            "count": self.count,
            "first": first,
            "status": status,
        }
