"""The pipeline's current details: a Markdown list of its steps, for the Temporal UI.

The Temporal UI shows a workflow's *current details* (the Markdown it reads
through the built-in ``__temporal_workflow_metadata`` query) on the workflow's
page, so a person sees the DAG's state without asking the ``progress`` query.
``workflow.set_current_details`` only keeps a string in the workflow's memory:
it schedules no command and writes no history event, so updating it changes
neither the history nor replay. :class:`StepBoard` notes every step result the
run writes; :class:`StepTable` renders again only when a step's row changed
(status, attempts, cached, for_each items) and sets the details only when the
Markdown changed.

A list, not a table: the UI renders current details (User Metadata → Current
Details) with its own Markdown renderer, whose tables have no cell padding, so
adjacent cells run together (``summarizellm-call``); a list item with its fields
between `` · `` reads the same everywhere. Counts are written ``3 of 10``: the
renderer turns ``3/10`` into a fraction glyph.

Bounded: at most :data:`MAX_ROWS` steps get a row, in the spec's order (past
that, one line counts the rest by status and points at the ``progress`` query),
and the text never passes :data:`MAX_CHARS`. Deterministic code only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.names import ENDED_STEP_STATUSES
    from aiworker.schemas.pipeline import StepResult

from aiworker.workflows.runs import in_run, this_run

# Rows past this are counted, not listed: the UI's details pane is for a glance.
MAX_ROWS = 50
# A hard ceiling on the Markdown (it travels in every metadata query's answer).
MAX_CHARS = 16_000

# (status, attempts, cached, items done, items total): what a row shows
Row = tuple[str, int, bool, int | None, int | None]


def row_of(result: StepResult) -> Row:
    """What a step's row shows of its result."""
    items = result.items or {}
    total = items.get("total")
    done = items.get("done", items.get("succeeded", 0) + items.get("failed", 0))
    return (
        result.status,
        result.attempts,
        result.cached,
        done if total is not None else None,
        total,
    )


# A frozenset, not a str.maketrans table: this module is shared by every run in
# the sandbox, where a module-level dict is state a run could change.
_MARKDOWN = frozenset("\\`*_[]<>|#")


def _text(text: str) -> str:
    """``text`` shown as it is (Markdown's special characters escaped)."""
    return "".join(f"\\{c}" if c in _MARKDOWN else c for c in text)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def step_line(step_id: str, worker: str, row: Row) -> str:
    """One step's list item: ``- **read** · web-scrape · running · 2 attempts ·
    items 3 of 10`` (attempts when any, items for a for_each)."""
    st, attempts, cached, done, total = row
    fields = [f"**{_text(step_id)}**", _text(worker), f"{st}{' (cached)' if cached else ''}"]
    if attempts:
        fields.append(_plural(attempts, "attempt"))
    if total is not None:
        fields.append(f"items {done} of {total}")
    return "- " + " · ".join(fields)


def render_table(name: str, status: str, workers: dict[str, str], rows: dict[str, Row]) -> str:
    """The Markdown the UI shows: a headline, then one list item per step (spec order).

    Args:
        name: the pipeline's name.
        status: the run's status (``running``, ``waiting``, a terminal status).
        workers: step id -> worker id, in the spec's order.
        rows: step id -> :func:`row_of` of its latest result.
    """
    ended = sum(1 for r in rows.values() if r[0] in ENDED_STEP_STATUSES)
    lines = [f"**{_text(name)}** · {status} · {ended} of {len(workers)} steps done", ""]
    size = sum(len(x) + 1 for x in lines)
    rest: Counter[str] = Counter()
    for n, (sid, worker) in enumerate(workers.items()):
        row = rows.get(sid, ("pending", 0, False, None, None))
        line = step_line(sid, worker, row)
        if n >= MAX_ROWS or size + len(line) + 200 > MAX_CHARS:
            rest[row[0]] += 1
            continue
        lines.append(line)
        size += len(line) + 1
    if rest:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(rest.items()))
        lines += ["", f"… {sum(rest.values())} more steps ({counts}): the `progress` query has all"]
    return "\n".join(lines)


@dataclass
class StepTable:
    """The run's step list: rows as steps change, the details set when they differ."""

    name: str = ""
    status: str = "running"
    workers: dict[str, str] = field(default_factory=dict)
    rows: dict[str, Row] = field(default_factory=dict)
    shown: str = ""
    started: bool = False
    run_id: str | None = field(default_factory=this_run)  # shown only inside this run

    def start(self, name: str, workers: dict[str, str], status: str) -> None:
        """The spec is checked: name the steps and show the first table."""
        self.name, self.workers, self.status, self.started = name, workers, status, True
        self.show()

    def note(self, step_id: str, result: StepResult) -> None:
        """A step's result was written; show the table again if its row changed."""
        row = row_of(result)
        if self.rows.get(step_id) != row:
            self.rows[step_id] = row
            self.show()

    def set_status(self, status: str) -> None:
        """The run's status changed."""
        if status != self.status:
            self.status = status
            self.show()

    def show(self) -> None:
        """Set the workflow's current details, when the Markdown changed."""
        if not self.started:  # before the spec is checked there is no table
            return
        if not in_run(self.run_id):
            # a run's coroutines closed by the garbage collector after a worker
            # that stopped dropped it write results outside any workflow, or in
            # another run's task: never into another run's details (workflows.runs)
            return
        text = render_table(self.name, self.status, self.workers, self.rows)
        if text != self.shown:
            self.shown = text
            workflow.set_current_details(text)


class StepBoard(dict[str, StepResult]):
    """The run's step results: a dict that tells ``on_set`` of every result written."""

    def __init__(self, on_set: Callable[[str, StepResult], None] | None = None) -> None:
        super().__init__()
        self.on_set = on_set

    def __setitem__(self, key: str, value: StepResult) -> None:
        super().__setitem__(key, value)
        if self.on_set is not None:
            self.on_set(key, value)
