"""Following a pipeline while ``aiworker run`` (and ``redrive``, ``demo``) waits.

Three output modes, chosen by :func:`choose_view`:

- a terminal (stdout is a TTY): :class:`LiveView` redraws one line in place
  (:func:`~aiworker.workers.client.progress.progress_line`) ten times a second from
  the latest snapshot, then clears it;
- anything else (a pipe, a file, a CI log): :class:`PlainView` prints one line
  per step status change and per wait that lasted long enough, and a line
  every :data:`STREAM_LINE_SECONDS` for a step whose model reply streams
  (its tokens so far and last words), no escape codes;
- ``--json``: no view; the result JSON alone on stdout, long waits on stderr
  (:func:`~aiworker.workers.client.waits.report_waits`).

The views end with the :func:`~aiworker.workers.client.progress.summary` table.
The loop here is thin: it polls the ``progress`` query once a second (at most
:data:`~aiworker.workers.client.waits.MAX_POLLS` times) and hands each snapshot to
the view, which ticks on its own between polls (a query can take long); what is
drawn is decided by the pure functions of :mod:`aiworker.workers.client.progress`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from temporalio.exceptions import TemporalError

from aiworker.workers.cli.common import (
    EXIT_OK,
    err,
    outcome_code,
    print_outcome,
    warn_duplicates,
)
from aiworker.workers.client.progress import (
    FIELD_HINT,
    Snapshot,
    progress_line,
    step_events,
    stream_events,
    summary,
    ui_base,
    workflow_link,
)
from aiworker.workers.client.terminal import raw_stream, safe_text
from aiworker.workers.client.waits import (
    MAX_POLLS,
    POLL_SECONDS,
    WaitNotices,
    outcome_telling_waits,
    snapshot,
    stop_if_cancelled,
    telling_unserved,
)

if TYPE_CHECKING:
    from temporalio.client import Client

    from aiworker.workers.client.client import PipelineClient, PipelineHandle

# The live line's redraw period (the spinner and the clock move between polls).
FRAME_SECONDS = 0.1
# A streaming step's plain line repeats at most this often (the live line moves each poll).
STREAM_LINE_SECONDS = 5.0


class View(Protocol):
    """Where a followed run shows: a live line, plain lines."""

    frame_seconds: float

    def update(self, snap: Snapshot, elapsed: float) -> None:
        """A new snapshot from the ``progress`` query."""

    def tick(self, elapsed: float) -> None:
        """Time passed (redraw what moves)."""

    def close(self, doc: dict[str, Any] | None, elapsed: float) -> None:
        """The run ended (``doc``, its outcome) or the watch stopped (``None``)."""

    def notice(self, line: str) -> None:
        """A line for stderr while the view shows (``aiworker: ...``)."""


class _Output:
    """Where a view writes, and what its summary names: the pipeline, its steps'
    workers, the UI link."""

    def __init__(
        self,
        out: IO[str],
        name: str,
        link: str | None = None,
        workers: Mapping[str, str] | None = None,
        fields: Sequence[str] = (),
        hint: str = FIELD_HINT,
    ) -> None:
        self.out, self.name, self.link, self.workers = out, name, link, workers
        self.fields, self.hint = fields, hint

    def summary(self, doc: dict[str, Any], elapsed: float) -> str:
        """The run's :func:`~aiworker.workers.client.progress.summary` table."""
        return summary(
            doc,
            name=self.name,
            workers=self.workers,
            elapsed=elapsed,
            link=self.link,
            fields=self.fields,
            hint=self.hint,
        )


class PlainView(_Output):
    """One line per step status change and per long wait: for pipes and logs."""

    frame_seconds = POLL_SECONDS

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last: Snapshot | None = None
        self.notices = WaitNotices()
        self.streamed: Snapshot | None = None
        self.streamed_at = float("-inf")

    def _say(self, elapsed: float, line: str) -> None:
        print(f"[{elapsed:6.1f}s] {line}", file=self.out, flush=True)

    def update(self, snap: Snapshot, elapsed: float) -> None:
        """Say what changed since the last snapshot, and the waits now worth a line."""
        for line in step_events(self.last, snap):
            self._say(elapsed, line)
        for line in self.notices.seen(snap.waits, time.monotonic(), snap.limits):
            self._say(elapsed, line)
        if snap.streams and elapsed - self.streamed_at >= STREAM_LINE_SECONDS:
            lines = stream_events(self.streamed, snap)
            for line in lines:
                self._say(elapsed, line)
            if lines:
                self.streamed, self.streamed_at = snap, elapsed
        self.last = snap

    def tick(self, elapsed: float) -> None:
        """Nothing moves between polls in plain lines."""

    def notice(self, line: str) -> None:
        """On stderr, as it comes."""
        err(line)

    def close(self, doc: dict[str, Any] | None, elapsed: float) -> None:
        """The summary table: the last word on every step (changes after the last
        poll show there, not as lines of their own)."""
        if doc is None:
            return
        print(self.summary(doc, elapsed), file=self.out, flush=True)


class LiveView(_Output):
    """One line redrawn in place on a terminal, cleared when the run ends."""

    frame_seconds = FRAME_SECONDS

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.snap: Snapshot | None = None
        self.frame = 0
        encoding = getattr(self.out, "encoding", None) or "ascii"
        try:
            "⠋·…".encode(encoding)
            self.ascii_only = False
        except (UnicodeEncodeError, LookupError):
            self.ascii_only = True

    def update(self, snap: Snapshot, elapsed: float) -> None:
        """Keep the latest snapshot; the next tick draws it."""
        self.snap = snap

    def tick(self, elapsed: float) -> None:
        """Redraw the line: carriage return, the line, erase to the end of the line."""
        width = shutil.get_terminal_size((80, 24)).columns - 1
        line = progress_line(
            self.name, self.snap, elapsed, self.frame, width=width, ascii_only=self.ascii_only
        )
        self.frame += 1
        # the one writer of control sequences: around a line whose text came from
        # Temporal, escaped (workers/client/terminal.py)
        raw_stream(self.out).write(f"\r{safe_text(line)}\x1b[K")
        self.out.flush()

    def notice(self, line: str) -> None:
        """Clear the live line first (stdout and stderr share the terminal); the next
        tick draws it again under the notice."""
        raw_stream(self.out).write("\r\x1b[K")
        self.out.flush()
        err(line)

    def close(self, doc: dict[str, Any] | None, elapsed: float) -> None:
        """Clear the line; then the summary table."""
        raw_stream(self.out).write("\r\x1b[K")
        if doc is not None:
            self.out.write(self.summary(doc, elapsed) + "\n")
        self.out.flush()


def choose_view(
    out: IO[str],
    name: str,
    link: str | None,
    workers: Mapping[str, str] | None = None,
    fields: Sequence[str] = (),
    hint: str = FIELD_HINT,
) -> View:
    """A live line on a terminal, plain lines anywhere else; the summary shows the
    output ``fields`` whole and says ``hint`` for a field it cuts."""
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return LiveView(out, name, link, workers, fields, hint)
    return PlainView(out, name, link, workers, fields, hint)


async def _poll(pipelines: PipelineClient, workflow_id: str, view: View, start: float) -> None:
    """Hand the view the run's snapshot every :data:`POLL_SECONDS` (at most
    :data:`MAX_POLLS` polls), until cancelled."""
    for _ in range(MAX_POLLS):
        clock = time.monotonic()
        try:
            snap = await snapshot(pipelines.temporal, workflow_id)
        except TemporalError:  # not started yet, or ended: the next poll
            stop_if_cancelled()
        else:
            view.update(snap, clock - start)
        await asyncio.sleep(max(0.0, clock + POLL_SECONDS - time.monotonic()))


async def _watch(pipelines: PipelineClient, workflow_id: str, view: View, start: float) -> None:
    """Poll the run's snapshot (:func:`_poll`) and tick the view, until cancelled.

    The ticks do not wait for the polls: a run no worker has picked up answers its
    query only when the server gives up on it (half a minute), and the live line
    must keep moving meanwhile."""
    polls = asyncio.create_task(_poll(pipelines, workflow_id, view, start))
    try:
        frames = int(MAX_POLLS * POLL_SECONDS / view.frame_seconds)
        for _ in range(frames):
            view.tick(time.monotonic() - start)
            await asyncio.sleep(view.frame_seconds)
    finally:
        polls.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await polls


async def follow(pipelines: PipelineClient, handle: PipelineHandle, view: View) -> dict[str, Any]:
    """:meth:`PipelineClient.outcome` of ``handle``, shown on ``view`` as it runs
    and summed up when it ends; a line on stderr when no worker picks it up
    (:func:`~aiworker.workers.client.waits.tell_unserved`)."""
    start = time.monotonic()
    watch = asyncio.create_task(_watch(pipelines, handle.id, view, start))
    doc: dict[str, Any] | None = None
    try:
        # a run no worker picks up answers no progress query: its description tells
        async with telling_unserved(pipelines.temporal, handle.id, view.notice):
            doc = await pipelines.outcome(handle.id, handle.result_run_id)
        return doc
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        view.close(doc, time.monotonic() - start)


def run_link(temporal: Client, ui_url: str | None, workflow_id: str) -> str | None:
    """The UI page of a workflow on ``temporal``'s namespace (``AIWORKER_UI_URL``,
    or the dev UI when Temporal is at the dev server's default address)."""
    base = ui_base(ui_url, temporal.service_client.config.target_host)
    return workflow_link(base, temporal.namespace, workflow_id)


async def show_run(
    pipelines: PipelineClient,
    handle: PipelineHandle,
    pipeline: Mapping[str, Any],
    link: str | None,
    fields: Sequence[str] = (),
    hint: str = FIELD_HINT,
) -> dict[str, Any]:
    """Follow a started pipeline on stdout (a live line or plain lines, then the
    summary table, with the output ``fields`` whole); its outcome."""
    name = str(pipeline.get("name"))
    workers = {str(s.get("id")): str(s.get("worker")) for s in pipeline.get("steps") or ()}
    view = choose_view(sys.stdout, name, link, workers, fields, hint)
    return await follow(pipelines, handle, view)


async def wait_and_show(
    pipelines: PipelineClient,
    handle: PipelineHandle,
    pipeline: Mapping[str, Any],
    ui_url: str | None,
    *,
    no_wait: bool = False,
    as_json: bool = False,
    fields: Sequence[str] = (),
) -> int:
    """What ``aiworker run`` and ``redrive`` print once the pipeline started; the
    exit code. The workflow id (``no_wait``); or the outcome JSON (``as_json``,
    with what a step has long waited for on stderr meanwhile); or a first line
    with the workflow id and UI link, the run's progress and the summary table
    (the output ``fields`` whole: ``--field``)."""
    from aiworker.workers.client.flow_start import FlowHandle, headline, wait_started

    name = pipeline.get("name")
    flow = handle.flow if isinstance(handle, FlowHandle) else None
    if flow is not None and flow.status != "started":
        # what flow control did, before any wait: a debounce or a queue may hold the
        # run long; stdout keeps the id (or the JSON) alone with --no-wait and --json
        line = f"{name}: {headline(flow)} ({flow.reason})"
        print(line, file=sys.stderr if no_wait or as_json else sys.stdout, flush=True)
    if no_wait:
        print(handle.id)
        return EXIT_OK
    if isinstance(handle, FlowHandle):
        await wait_started(handle)  # a queued or collapsed start's run may not exist yet
    if as_json:
        return print_outcome(await outcome_telling_waits(pipelines, handle, err))
    link = run_link(pipelines.temporal, ui_url, handle.id)
    why = f" ({flow.reason})" if flow is not None and flow.status == "started" else ""
    print(f"{name}: started {handle.id}{why}" + (f"  {link}" if link else ""))
    doc = await show_run(pipelines, handle, pipeline, link, fields)
    warn_duplicates(doc)
    return outcome_code(doc)
