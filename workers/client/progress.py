"""What a person reads while a pipeline runs and when it ends: pure renderers.

Three outputs, each a pure function of what it shows, so each is tested
without a terminal or a server:

- :func:`progress_line`: the one line a terminal redraws in place
  (``⠋ hello  2/3 steps · for_each 40/100 items · waiting: fetch at rate limit · 3.2s``),
  from a :class:`Snapshot` of the ``progress`` query and the time elapsed;
- :func:`step_events`: the plain lines of what changed between two snapshots
  (one per step whose status changed), for a log or a pipe;
- :func:`stream_events`: the plain lines of the steps whose model reply is
  streaming (``summarize: 84 tokens "…the kettle is a gooseneck"``), which
  the live line shows too; read from the running attempts' heartbeat details
  (:func:`stream_of`);
- :func:`summary`: the short table a run ends with (each step's status,
  attempts and duration, the output on one line, the error, the UI link).

The loop that polls and draws is :mod:`aiworker.workers.client.watch`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiworker.schemas.names import ENDED_STEP_STATUSES as ENDED

# (step or "" for the pipeline, kind of permit, whether for_each items wait)
Wait = tuple[str, str, bool]

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ASCII_SPINNER = "|/-\\"

_KIND = {"rate": "at rate limit", "concurrency": "for a concurrency slot"}
# The output's line (or a field's) in the summary stops here: the full result is
# --json's, a field's `run --field`'s.
OUTPUT_CHARS = 160
# The end of a streaming reply a progress line quotes.
STREAM_TAIL_CHARS = 32


@dataclass(frozen=True)
class Snapshot:
    """One answer of the ``progress`` query, with the waits of its for_each chunks.

    Attributes:
        status: the run's status (``running``, ``waiting``, ``awaiting_review``, ...).
        steps: step id -> its progress entry (``status``, ``attempts``,
            ``duration_ms``, ``items`` for a for_each).
        waits: who waits at a limiter now, and how many (:data:`Wait` keys).
        awaiting_review: the steps waiting for a human decision.
        awaiting_callback: the wait steps waiting for their callback, once each
            (``sign (3 tokens)`` for a for_each with three open).
        streams: step id -> the heartbeat details of its streaming model call
            (``partial_text``, ``chars``, ``tokens``, ``usage``: :func:`stream_of`).
        limits: step id (or "" for the pipeline) -> the limit it waits for, with its
            configured rate (``rate:web-scrape:acme (10 per 60s)``).
    """

    status: str = "running"
    steps: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    waits: Counter[Wait] = field(default_factory=Counter)
    awaiting_review: tuple[str, ...] = ()
    # wait steps waiting for their callback (a for_each's: how many tokens)
    awaiting_callback: tuple[str, ...] = ()
    streams: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        progress: Mapping[str, Any],
        waits: Counter[Wait] | None = None,
        streams: Mapping[str, Mapping[str, Any]] | None = None,
        limits: Mapping[str, str] | None = None,
    ) -> Snapshot:
        """A snapshot of a ``progress`` answer (or a result document), its waits and
        its streaming steps."""
        steps = progress.get("steps")
        return cls(
            status=str(progress.get("status") or "running"),
            steps=steps if isinstance(steps, Mapping) else {},
            waits=waits or Counter(),
            awaiting_review=tuple(progress.get("awaiting_review") or ()),
            awaiting_callback=_callbacks(progress.get("awaiting_callback")),
            streams=streams or {},
            limits={**(progress.get("limits") or {}), **(limits or {})},
        )


def _callbacks(waiting: Any) -> tuple[str, ...]:
    """``awaiting_callback`` entries as one label per step: its id, and for a for_each
    how many of its tokens are open."""
    open_: Counter[str] = Counter()
    listed: set[str] = set()
    for w in waiting if isinstance(waiting, list) else []:
        if isinstance(w, Mapping) and isinstance(w.get("step"), str):
            open_[w["step"]] += 1
            if w.get("item") is not None:
                listed.add(w["step"])
    return tuple(
        f"{step} ({n} token{'s' if n > 1 else ''})" if step in listed else step
        for step, n in open_.items()
    )


def stream_of(details: Sequence[Any]) -> Mapping[str, Any] | None:
    """The streaming progress in a running attempt's decoded heartbeat details
    (the one object ``{"step", "partial_text", "chars", "tokens", "usage"}``), or None."""
    for d in details:
        if (
            isinstance(d, Mapping)
            and isinstance(d.get("partial_text"), str)
            and isinstance(d.get("chars"), int)
        ):
            return d
    return None


def stream_text(step: str, stream: Mapping[str, Any], *, ascii_only: bool = False) -> str:
    """``<step>: <n> tokens "…<the last words>"``: what a streaming step has said so far."""
    partial = str(stream.get("partial_text") or "")
    text = " ".join(partial.split())
    tail = text[-STREAM_TAIL_CHARS:]
    chars = stream.get("chars")
    cut = len(text) > len(tail) or (isinstance(chars, int) and chars > len(partial))
    if len(text) > len(tail) and " " in tail:  # start at a word, not inside one
        tail = tail[tail.index(" ") + 1 :]
    ellipsis = ("..." if ascii_only else "…") if cut else ""
    n = stream.get("tokens")
    n = n if isinstance(n, int) else 0
    return f'{step}: {n} token{"" if n == 1 else "s"} "{ellipsis}{tail.lstrip(" …")}"'


def _running(snap: Snapshot) -> list[str]:
    """The running steps that are not streaming (those show their text instead)."""
    return [
        sid
        for sid, s in snap.steps.items()
        if s.get("status") == "running" and sid not in snap.streams
    ]


def _items(step: Mapping[str, Any]) -> tuple[int, int] | None:
    """A for_each step's items (done, total), or None."""
    items = step.get("items")
    if not isinstance(items, Mapping) or not isinstance(items.get("total"), int):
        return None
    done = items.get("done", (items.get("succeeded") or 0) + (items.get("failed") or 0))
    return int(done), int(items["total"])


def _seconds(ms: Any) -> str:
    return f"{float(ms or 0) / 1000:.2f}s"


def _waiting(snap: Snapshot) -> str:
    """What the run waits for now, most telling first: a limiter, a review, the running steps."""
    if snap.waits:
        parts = []
        for (step, kind, items), n in sorted(snap.waits.items()):
            why = _KIND.get(kind, f"for a {kind} permit")
            who = step or "pipeline"
            parts.append(f"{who} ({n} items) {why}" if items else f"{who} {why}")
        return "waiting: " + ", ".join(parts)
    if snap.awaiting_review:
        return "awaiting review: " + ", ".join(snap.awaiting_review)
    if snap.awaiting_callback:
        return "awaiting callback: " + ", ".join(snap.awaiting_callback)
    running = _running(snap)
    return "running: " + ", ".join(running) if running else ""


def progress_line(
    name: str,
    snap: Snapshot | None,
    elapsed: float,
    frame: int = 0,
    *,
    width: int | None = None,
    ascii_only: bool = False,
) -> str:
    """The line a terminal redraws: spinner, name, steps and items done, what
    it waits for, elapsed time; cut to ``width`` characters (a wrapped line
    cannot be redrawn in place)."""
    spin = (ASCII_SPINNER if ascii_only else SPINNER)[
        frame % len(ASCII_SPINNER if ascii_only else SPINNER)
    ]
    dot = " - " if ascii_only else " · "
    parts = []
    if snap is None:
        parts.append("starting")
    else:
        steps = snap.steps.values()
        done = sum(1 for s in steps if s.get("status") in ENDED)
        parts.append(f"{done}/{len(snap.steps)} steps")
        counts = [c for c in (_items(s) for s in steps) if c is not None]
        if counts:
            parts.append(f"for_each {sum(d for d, _ in counts)}/{sum(t for _, t in counts)} items")
        if what := _waiting(snap):
            parts.append(what)
        parts.extend(
            stream_text(sid, st, ascii_only=ascii_only) for sid, st in snap.streams.items()
        )
    parts.append(f"{elapsed:.1f}s")
    line = f"{spin} {name}  " + dot.join(parts)
    if width is not None and len(line) > width:
        line = line[: max(0, width - 1)] + ("~" if ascii_only else "…")
    return line


def _describe(sid: str, step: Mapping[str, Any]) -> str:
    """``<step>: <status>``, with attempts, items and duration once it ended."""
    status = str(step.get("status"))
    text = f"{sid}: {status}"
    if status not in ENDED:
        return text
    details = ["reused"] if step.get("reused_from") else []
    if counts := _items(step):
        details.append(f"{counts[0]}/{counts[1]} items")
    else:
        n = int(step.get("attempts") or 0)
        details.append(f"{n} attempt{'' if n == 1 else 's'}")
    details.append(_seconds(step.get("duration_ms")))
    if step.get("cached") is True:
        details.append("cached")
    if step.get("error_code"):
        details.append(str(step["error_code"]))
    return f"{text} ({', '.join(details)})"


def step_events(before: Snapshot | None, after: Snapshot) -> list[str]:
    """One line per step whose status changed from ``before`` to ``after``
    (every step not ``pending`` when there is no ``before``)."""
    lines = []
    for sid, step in after.steps.items():
        old = before.steps.get(sid, {}).get("status") if before else "pending"
        if step.get("status") != old:
            lines.append(_describe(sid, step))
    return lines


def stream_events(before: Snapshot | None, after: Snapshot) -> list[str]:
    """One line per streaming step whose reply grew from ``before`` to ``after``."""
    lines = []
    for sid, st in after.streams.items():
        old = before.streams.get(sid) if before else None
        if old is None or old.get("chars") != st.get("chars"):
            lines.append(stream_text(sid, st))
    return lines


# Where `aiworker dev` serves the Temporal server and its Web UI by default.
DEV_ADDRESSES = frozenset(("localhost:7233", "127.0.0.1:7233"))
DEV_UI_URL = "http://localhost:8233"


def ui_base(configured: str | None, target_host: str) -> str | None:
    """The Web UI's address: ``AIWORKER_UI_URL``, else the dev UI's when Temporal
    is the dev server's default address, else None (no link)."""
    if configured:
        return configured
    return DEV_UI_URL if target_host in DEV_ADDRESSES else None


def workflow_link(ui_url: str | None, namespace: str, workflow_id: str) -> str | None:
    """The Temporal UI's page of a workflow, or None without a UI address."""
    if not ui_url:
        return None
    return f"{ui_url.rstrip('/')}/namespaces/{quote(namespace)}/workflows/{quote(workflow_id)}"


def _cut(text: str, hint: str) -> str:
    if len(text) <= OUTPUT_CHARS:
        return text
    return text[: OUTPUT_CHARS - 1] + f"…  ({hint} prints it whole)"


# What a cut output field's line says prints it whole (``{key}``: the field's name).
FIELD_HINT = "--field {key}"


def output_lines(output: Any, fields: Sequence[str] = (), hint: str = FIELD_HINT) -> list[str]:
    """The pipeline's output in the summary table.

    One line, ``output: {...}``, when it fits in :data:`OUTPUT_CHARS` and no
    field was asked for. Otherwise one line per output field, so a long field
    (an article's Markdown) does not hide a short one (its summary): a field of
    ``fields`` (``run --field``) whole, a string as its text with its lines
    kept; any other field cut at :data:`OUTPUT_CHARS`, saying how to see it whole
    (``hint``: ``--json`` where the command takes no ``--field``, as ``demo``).
    """
    if not output:
        return []
    whole = json.dumps(output, ensure_ascii=False)
    if not isinstance(output, Mapping) or (len(whole) <= OUTPUT_CHARS and not fields):
        return [f"output: {_cut(whole, '--json')}"]
    lines = []
    for key, value in output.items():
        if key in fields:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"output.{key}:" + ("\n" if "\n" in text else " ") + text)
        else:
            how = hint.format(key=key) if len(str(key).split()) == 1 else "--json"
            lines.append(f"output.{key}: {_cut(json.dumps(value, ensure_ascii=False), how)}")
    return lines


def summary(
    doc: Mapping[str, Any],
    *,
    name: str,
    workers: Mapping[str, str] | None = None,
    elapsed: float | None = None,
    link: str | None = None,
    fields: Sequence[str] = (),
    hint: str = FIELD_HINT,
) -> str:
    """The short table a run ends with: status, one row per step (worker, status,
    attempts, duration), the output (:func:`output_lines`; ``fields`` whole), the
    error, the workflow and its link."""
    steps: Mapping[str, Any] = doc.get("steps") or {}
    took = f" in {elapsed:.1f}s" if elapsed is not None else ""
    lines = [f"{name} {doc.get('status')}{took}"]
    if steps:
        workers = workers or {}
        rows = [("step", "worker", "status", "attempts", "duration")]
        for sid, s in steps.items():
            status = str(s.get("status"))
            if s.get("cached") is True:
                status += " (cached)"
            if s.get("reused_from"):
                status += " (reused)"
            if counts := _items(s):
                status += f" {counts[0]}/{counts[1]} items"
            rows.append(
                (
                    sid,
                    workers.get(sid, "-"),
                    status,
                    str(s.get("attempts", 0)),
                    _seconds(s.get("duration_ms")),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            left = "  ".join(r[i].ljust(widths[i]) for i in range(3))
            lines.append(f"  {left}  {r[3].rjust(widths[3])}  {r[4].rjust(widths[4])}")
    lines.extend(output_lines(doc.get("output"), fields, hint))
    error = doc.get("error")
    if isinstance(error, Mapping):
        where = f" (step {error['step']})" if error.get("step") else ""
        lines.append(f"error: {error.get('code')}: {error.get('message')}{where}")
    wid = doc.get("workflow_id")
    if wid or link:
        lines.append("  ".join(x for x in (f"workflow: {wid}" if wid else "", link or "") if x))
    return "\n".join(lines)
