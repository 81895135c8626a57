"""``aiworker replay``: the replay gate. Recorded histories against the current code.

Each history (a file, or a workflow fetched with a visibility query) is replayed
by the SDK's :class:`temporalio.worker.Replayer` with what a production worker
process runs: the workflows of ``WORKFLOWS_BY_QUEUE``, the sandbox of
:func:`aiworker.workers.process.plugin.workflow_runner` (its pass-through modules
included), the process's data converter and the process's worker catalog
(installed as ``aiworker worker`` installs it, so workflows read the specs
this deploy would read). The first history that does not replay stops the
gate (exit 1), named with the event where the code and the history part.

History files are what ``temporal workflow show --output json`` and
:meth:`temporalio.client.WorkflowHistory.to_json` write: ``{"events": [...]}``.
The workflow id a replay runs under (permit tickets carry it) is read from the
first event (``workflowExecutionStartedEventAttributes.workflowId``, which the
server fills in), else the file's name stands in. A directory argument means
every ``*.json`` in it. A file is bounded before it is parsed
(:data:`MAX_HISTORY_FILE_BYTES`, and :data:`MAX_HISTORY_JSON_DEPTH` levels
counted without recursion, since the JSON decoder recurses per level): a
malformed file is bad usage (exit 2) naming it, never an unexpected error.

Why the event is found here and not read from the error: the SDK's
nondeterminism message names the mismatch ("Activity type of scheduled event
'x' does not match ...") but often not the event id. :func:`locate` replays
prefixes of the history that end at a workflow task's start (the history a
worker sees at that task) to find the first workflow task whose commands do
not match, then names the first command event of that task the message points
at (a quoted name in it), else the task's first command event.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToJson
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from aiworker.schemas import names

if TYPE_CHECKING:
    # the SDK's client and worker load when the command runs (``aiworker --help``
    # and the other commands do not pay for them)
    from temporalio.client import Client, WorkflowHistory
    from temporalio.converter import DataConverter
    from temporalio.worker import Replayer

# Replaying a history cut anywhere but at a workflow task's start waits for a task
# that never comes; these are the cuts a worker itself would have seen.
_TASK_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
_TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
# Events a workflow task's commands write (what replay matches commands against).
_COMMAND_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
        EventType.EVENT_TYPE_TIMER_STARTED,
        EventType.EVENT_TYPE_TIMER_CANCELED,
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
        EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED,
    }
)
_EVENT_IN_MESSAGE = re.compile(r"HistoryEvent\(id: (\d+)")
_CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')


MAX_HISTORY_FILE_BYTES = 256 * 1024 * 1024
"""Bytes of one history file. Temporal refuses a history past 50 MB by default
(``limit.historySize.error``); its JSON (base64 payloads, indentation) stays well
under this."""
MAX_HISTORY_JSON_DEPTH = 100
"""Nesting of a history file's JSON: protobuf's JSON reader (which the SDK's
``WorkflowHistory.from_json`` uses) refuses deeper messages, and a real history
nests a few dozen levels (a failure's chain of causes is the deepest part)."""

# A JSON string (escapes included), or one bracket: what nesting is counted from.
_JSON_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class HistoryFileError(ValueError):
    """A history file that cannot be read or is not a workflow history."""


@dataclass(frozen=True)
class Recorded:
    """One history to replay and how a person names it (a file, or id and run id)."""

    name: str
    history: WorkflowHistory


@dataclass(frozen=True)
class Mismatch:
    """Why a history did not replay: the event where code and history part."""

    name: str
    workflow_id: str
    run_id: str
    event_id: int | None
    event_type: str | None
    nondeterminism: bool
    message: str

    def render(self) -> str:
        """One line: the history, the event, what the SDK said."""
        kind = "nondeterminism" if self.nondeterminism else "replay failed"
        at = f" at event {self.event_id} ({self.event_type})" if self.event_id is not None else ""
        return (
            f"{self.name}: {kind}{at}, workflow {self.workflow_id} run {self.run_id}: "
            f"{self.message}"
        )


def history_files(paths: Iterable[str]) -> list[Path]:
    """The files named, a directory standing for its ``*.json`` (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise HistoryFileError(f"{p}: no *.json history files in this directory")
            out += found
        else:
            out.append(p)
    return out


def load_history(path: Path) -> Recorded:
    """One history file, checked enough that replay reads a workflow history.

    Raises:
        HistoryFileError: unreadable, not JSON, no events, or not a workflow's
            history (its first event is no workflow start).
    """
    try:
        size = path.stat().st_size
        if size > MAX_HISTORY_FILE_BYTES:
            raise HistoryFileError(
                f"{path}: {size} bytes; a history file may have at most "
                f"{MAX_HISTORY_FILE_BYTES} (Temporal's own limit on a history is far below)"
            )
        text = path.read_text("utf-8")
        # counted before anything recursive reads it: the JSON decoder recurses per
        # level, and protobuf's reader refuses more than its own depth anyway
        depth = json_nesting(text, MAX_HISTORY_JSON_DEPTH)
        if depth > MAX_HISTORY_JSON_DEPTH:
            raise HistoryFileError(
                f"{path}: not a workflow history: JSON nested deeper than "
                f"{MAX_HISTORY_JSON_DEPTH} levels (a history nests a few dozen)"
            )
        raw: Any = json.loads(text)
    except OSError as e:
        raise HistoryFileError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise HistoryFileError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise HistoryFileError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("events"), list) or not raw["events"]:
        raise HistoryFileError(
            f'{path}: not a workflow history: expected {{"events": [...]}} as '
            "`temporal workflow show --output json` writes it"
        )
    from temporalio.client import WorkflowHistory

    first = raw["events"][0]
    started = (
        first.get("workflowExecutionStartedEventAttributes", {}) if isinstance(first, dict) else {}
    )
    workflow_id = started.get("workflowId") if isinstance(started, dict) else None
    try:
        history = WorkflowHistory.from_json(
            workflow_id if isinstance(workflow_id, str) and workflow_id else path.stem, raw
        )
    except Exception as e:  # protobuf's ParseError and the SDK's fix-ups of enum names
        raise HistoryFileError(f"{path}: not a workflow history: {_first_line(e)}") from None
    if history.events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise HistoryFileError(
            f"{path}: not a workflow history: its first event is no workflow start"
        )
    return Recorded(str(path), history)


def json_nesting(text: str, limit: int) -> int:
    """How deep the brackets of the JSON ``text`` nest (strings skipped), counted
    without recursion; the count stops past ``limit`` (any value above it means
    too deep). Malformed JSON is the decoder's to name: this only counts."""
    depth = deepest = 0
    for m in _JSON_STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif c == "]" or c == "}":
            depth -= 1
    return deepest


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def aiworker_workflows() -> list[type]:
    """Every workflow class aiworker runs: the pipelines queue's and the conformance kit's."""
    from aiworker.workers.process.task_queues import WORKFLOWS_BY_QUEUE
    from aiworker.workflows.conformance import ConformanceWorkflow

    out: list[type] = [ConformanceWorkflow]
    for classes in WORKFLOWS_BY_QUEUE.values():
        out += [c for c in classes if c not in out]
    return out


def workflow_type_names() -> set[str]:
    """The workflow type names of :func:`aiworker_workflows` (each class's
    ``@workflow.defn(name=...)``, read from the names they are declared with:
    the SDK has no public reader of a class's definition)."""
    return {
        names.PIPELINE_WORKFLOW,
        names.FOREACH_WORKFLOW,
        names.AGENT_WORKFLOW,
        names.LIMITER_WORKFLOW,
        names.SHARED_BREAKER_WORKFLOW,
        names.WORKER_REGISTRY_WORKFLOW,
        names.FLOW_WORKFLOW,
        names.FLOW_SCHEDULED_WORKFLOW,
        names.EVAL_WORKFLOW,
        "ConformanceWorkflow",
    }


def workflow_type(history: WorkflowHistory) -> str:
    """The workflow type a history's first event names."""
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def check_types(recorded: Sequence[Recorded]) -> None:
    """Refuse a history of a workflow type that aiworker does not define.

    Raises:
        HistoryFileError: naming the file and the type.
    """
    known = workflow_type_names()
    for rec in recorded:
        kind = workflow_type(rec.history)
        if kind not in known:
            raise HistoryFileError(
                f"{rec.name}: a {kind!r} workflow is not aiworker's; "
                f"the gate replays {', '.join(sorted(known))}"
            )


async def query_histories(
    client: Client, query: str, limit: int, skipped: list[str] | None = None
) -> AsyncIterator[Recorded]:
    """The histories of up to ``limit`` workflows (closed or running) a visibility
    query finds in the client's namespace, newest first; workflows of types
    aiworker does not define (the namespace's other workflows) are named in
    ``skipped`` instead of replayed."""
    known = workflow_type_names()
    async for wf in client.list_workflows(query, limit=limit):
        if wf.workflow_type not in known:
            if skipped is not None:
                skipped.append(f"workflow {wf.id} run {wf.run_id} ({wf.workflow_type})")
            continue
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        history = await handle.fetch_history()
        yield Recorded(f"workflow {wf.id} run {wf.run_id}", history)


def replayer(converter: DataConverter) -> Replayer:
    """A replayer with the production worker's workflows, sandbox and converter."""
    from temporalio.runtime import Runtime, TelemetryConfig
    from temporalio.worker import Replayer

    from aiworker.workers.process.plugin import workflow_runner

    return Replayer(
        workflows=aiworker_workflows(),
        workflow_runner=workflow_runner(),
        data_converter=converter,
        # Core logs each failed workflow task as a warning: the bisection in
        # locate() fails some on purpose, and the gate names the one that matters
        runtime=Runtime(telemetry=TelemetryConfig(logging=None, metrics=None)),
    )


async def replay_all(
    histories: AsyncIterator[Recorded] | Iterable[Recorded],
    converter: DataConverter,
    *,
    on_ok: Any = None,
) -> tuple[int, Mismatch | None]:
    """Replay each history in turn; stop at the first that fails.

    Returns how many replayed and the first :class:`Mismatch` (None when all did).
    ``on_ok(recorded)`` is called for each history that replayed.
    """
    r = replayer(converter)
    done = 0
    async for rec in _aiter(histories):
        result = await r.replay_workflow(rec.history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            return done, await locate(r, rec, result.replay_failure)
        done += 1
        if on_ok is not None:
            on_ok(rec)
    return done, None


async def _aiter(
    items: AsyncIterator[Recorded] | Iterable[Recorded],
) -> AsyncIterator[Recorded]:
    if isinstance(items, AsyncIterator):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


def core_message(failure: BaseException) -> str:
    """The SDK's message without Core's wrapping (``Failure { failure: ... }``)."""
    text = str(failure)
    m = _CORE_MESSAGE.search(text)
    return (m.group(1).replace('\\"', '"') if m else _first_line(failure))[:500]


async def locate(r: Replayer, rec: Recorded, failure: BaseException) -> Mismatch:
    """The event where ``rec`` stops replaying (see the module docstring)."""
    from temporalio.workflow import NondeterminismError

    history = rec.history
    events = list(history.events)
    message = core_message(failure)
    event: HistoryEvent | None = None
    named = _EVENT_IN_MESSAGE.search(str(failure))
    if named is not None:
        event = next((e for e in events if e.event_id == int(named.group(1))), None)
    if event is None:
        event = await _first_bad_event(r, history.workflow_id, events, message)
    return Mismatch(
        name=rec.name,
        workflow_id=history.workflow_id,
        run_id=history.run_id,
        event_id=event.event_id if event is not None else None,
        event_type=EventType.Name(event.event_type) if event is not None else None,
        nondeterminism=isinstance(failure, NondeterminismError),
        message=message,
    )


async def _first_bad_event(
    r: Replayer, workflow_id: str, events: Sequence[HistoryEvent], message: str
) -> HistoryEvent | None:
    from temporalio.client import WorkflowHistory

    cuts = [i + 1 for i, e in enumerate(events) if e.event_type == _TASK_STARTED]
    if not cuts:
        return None
    cuts.append(len(events))

    async def fails(cut: int) -> bool:
        prefix = WorkflowHistory(workflow_id, events[:cut])
        result = await r.replay_workflow(prefix, raise_on_replay_failure=False)
        return result.replay_failure is not None

    # The first cut whose prefix fails: the task whose commands did not match ends
    # before it (a failing prefix stays failing when it grows).
    lo, hi = 0, len(cuts) - 1
    if not await fails(cuts[hi]):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if await fails(cuts[mid]):
            hi = mid
        else:
            lo = mid + 1
    end = cuts[lo]
    start = cuts[lo - 1] if lo > 0 else 0
    task = events[start:end]
    commands = [e for e in task if e.event_type in _COMMAND_EVENTS]
    # "... of scheduled event 'x' does not match ... of activity command 'y'": the
    # value after "event" is the history's, so it names the event best
    for quoted in (re.findall(r"event '([^']+)'", message), re.findall(r"'([^']+)'", message)):
        for e in commands:
            text = MessageToJson(e)
            if any(f'"{q}"' in text for q in quoted):
                return e
    if commands:
        return commands[0]
    # no command event in the task: the code commanded something the history lacks
    return next((e for e in task if e.event_type == _TASK_COMPLETED), task[-1])


def say(line: str) -> None:
    """A progress line on stdout."""
    print(line, file=sys.stdout, flush=True)


async def cmd_replay(args: Any) -> int:
    """``aiworker replay [FILES...] [--query Q]``: exit 0 when every history replays,
    1 at the first that does not (named with its event), 2 for bad usage or a bad file."""
    from aiworker.workers.cli.common import (
        EXIT_FAILED,
        EXIT_OK,
        EXIT_USAGE,
        command_settings,
        err,
        process_catalog,
    )
    from aiworker.workers.client.temporal_client import data_converter

    if not args.files and args.query is None:
        err("replay needs history files (or directories of them), --query, or both")
        return EXIT_USAGE
    try:
        recorded = [load_history(p) for p in history_files(args.files)]
        check_types(recorded)
    except HistoryFileError as e:
        err(str(e))
        return EXIT_USAGE
    settings = command_settings(args)
    process_catalog(settings)  # the specs this deploy's workflows read, as a worker installs them
    converter = data_converter(settings)

    def ok(rec: Recorded) -> None:
        if not args.quiet:
            say(f"ok {rec.name} ({len(rec.history.events)} events)")

    try:
        done, mismatch = await replay_all(recorded, converter, on_ok=ok)
        if mismatch is None and args.query is not None:
            from aiworker.workers.client.temporal_client import connect

            client = await connect(args.profile, target_host=args.address, settings=settings)
            skipped: list[str] = []
            more, mismatch = await replay_all(
                query_histories(client, args.query, args.limit, skipped), converter, on_ok=ok
            )
            done += more
            for name in skipped:
                say(f"skip {name}: not an aiworker workflow")
    finally:
        from aiworker.workers.process.resources import close_connections

        await close_connections()
    if mismatch is not None:
        err(mismatch.render())
        return EXIT_FAILED
    say(f"replayed {done} histories: all deterministic")
    return EXIT_OK
