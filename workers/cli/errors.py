"""How a failed ``aiworker`` command reads: one line on stderr and an exit code.

Every exception a command lets escape comes through :func:`explain`, in
``cli.main``: what Temporal answers (no such workflow, a workflow that has
ended, a refused Update or query, an unreachable frontend, a refused request)
and aiworker's own start-up, redrive, schedule and step items errors become
one sentence a person reads, with an exit code of :mod:`aiworker.workers.cli.common`. Anything else
is a bug: one line too, saying so; ``aiworker --debug`` prints the traceback.
:func:`exit_process` is how every process that used a Temporal client ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from temporalio.client import (
    RPCTimeoutOrCancelledError,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.errors import WorkerError
from aiworker.config.extras import MissingExtraError
from aiworker.schemas.errors import ErrorCode
from aiworker.workers.cli.common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from aiworker.workers.client.temporal_client import TemporalUnreachableError
from aiworker.workers.devstack.devserver import DevServerError
from aiworker.workers.errors import StartupError

if TYPE_CHECKING:
    from aiworker.workers.client.step_items import StepItemsError


@dataclass(frozen=True)
class Failure:
    """What a command's failure prints (after ``aiworker: ``) and its exit code."""

    message: str
    code: int


# Temporal's answers that mean "the frontend is not there (yet)".
_UNREACHABLE = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
# Answers about the request itself: a bad query, a bad id, a refused argument.
_REFUSED = (
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.OUT_OF_RANGE,
)


def _subject(args: argparse.Namespace) -> str:
    """The workflow (or schedule) a command was about, as a message names it."""
    if args.command == "schedule":
        sid = getattr(args, "schedule_id", None)
        return f"schedule {sid!r}" if sid else "the schedule"
    wid = getattr(args, "workflow_id", None) or getattr(args, "id", None)
    return f"workflow {wid!r}" if wid else "the workflow"


def _rpc(e: RPCError, args: argparse.Namespace) -> Failure:
    if e.status in _UNREACHABLE:
        return Failure(f"cannot reach Temporal: {e.message}", EXIT_FAILED)
    if args.command == "schedule" and (
        e.status == RPCStatusCode.NOT_FOUND or "already completed" in e.message
    ):
        # Temporal names the schedule's internal workflow, and a schedule deleted a
        # moment ago answers as that workflow having completed; to a person both
        # mean the id names no schedule.
        return Failure(
            f"{_subject(args)} not found in this namespace (see `aiworker schedule list`)",
            EXIT_NOT_FOUND,
        )
    if "already completed" in e.message:
        return Failure(
            f"{_subject(args)} has already ended; only a running pipeline takes "
            f"`aiworker {args.command}` (see `aiworker list`)",
            EXIT_FAILED,
        )
    if e.status == RPCStatusCode.NOT_FOUND:
        return Failure(
            f"{_subject(args)} not found in this namespace ({e.message})", EXIT_NOT_FOUND
        )
    if e.status in _REFUSED:
        return Failure(f"Temporal refused the request: {e.message}", EXIT_USAGE)
    if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
        return Failure(f"Temporal refused access ({e.status.name}): {e.message}", EXIT_FAILED)
    return Failure(f"Temporal answered {e.status.name}: {e.message}", EXIT_FAILED)


def _items_exit(e: StepItemsError) -> int:
    """A damaged or unreachable part fails (1); no such step or no items is not
    found (3); asking a step that is not a for_each is bad usage (2)."""
    from aiworker.workers.client.step_items import ItemsPartError

    if isinstance(e, ItemsPartError):
        return EXIT_FAILED
    if e.code == ErrorCode.NOT_FOUND:
        return EXIT_NOT_FOUND
    return EXIT_USAGE if e.code == ErrorCode.INVALID_INPUT else EXIT_FAILED


def explain(e: BaseException, args: argparse.Namespace) -> Failure:
    """The one line and exit code of a command that raised ``e``.

    Args:
        e: what the command raised.
        args: the parsed command line (the command and the ids it named).

    Returns:
        The message (without the ``aiworker:`` prefix) and the exit code.
    """
    from aiworker.schemas.pipeline_check import PipelineSpecError
    from aiworker.workers.client.bulk import BulkQueryError
    from aiworker.workers.client.client import QuoteNotAcceptedError, RedriveError
    from aiworker.workers.client.flow_start import FlowRefusedError
    from aiworker.workers.client.step_items import StepItemsError
    from aiworker.workers.schedules.schedules import ScheduleExistsError
    from aiworker.workers.schedules.specs import ScheduleSpecError

    if isinstance(e, (StartupError, DevServerError, MissingExtraError)):
        return Failure(str(e), EXIT_USAGE)
    if isinstance(e, ScheduleSpecError):
        return Failure(f"invalid schedule: {e}", EXIT_USAGE)
    if isinstance(e, ScheduleExistsError):
        return Failure(str(e), EXIT_USAGE)
    if isinstance(e, QuoteNotAcceptedError):
        return Failure(str(e), EXIT_USAGE)
    if isinstance(e, RedriveError):
        return Failure(f"cannot redrive: {e}", EXIT_USAGE)
    if isinstance(e, BulkQueryError):
        return Failure(str(e), EXIT_USAGE)
    if isinstance(e, FlowRefusedError):
        return Failure(f"{e} ({e.code})", EXIT_USAGE)
    if isinstance(e, PipelineSpecError):
        return Failure(f"{e} (invalid_input)", EXIT_USAGE)
    if isinstance(e, StepItemsError):
        return Failure(f"{_subject(args)}: {e} ({e.code.value})", _items_exit(e))
    if isinstance(e, WorkerError):
        # the store's errors reading a payload back (not_found, access_denied): stable codes
        code = EXIT_NOT_FOUND if e.code == ErrorCode.NOT_FOUND else EXIT_FAILED
        return Failure(f"{e} ({e.code.value})", code)
    if isinstance(e, TemporalUnreachableError):
        return Failure(f"cannot reach Temporal: {e}", EXIT_FAILED)
    if isinstance(e, RPCError):
        return _rpc(e, args)
    if isinstance(e, WorkflowAlreadyStartedError):
        return Failure(
            f"workflow {e.workflow_id!r} is already running; wait for it, cancel it, "
            "or start with another --id",
            EXIT_USAGE,
        )
    if isinstance(e, WorkflowUpdateFailedError):
        cause = e.cause
        return Failure(f"{args.command} refused: {getattr(cause, 'message', cause)}", EXIT_FAILED)
    if isinstance(e, (WorkflowQueryFailedError, WorkflowQueryRejectedError)):
        return Failure(f"{_subject(args)} did not answer the query: {e}", EXIT_FAILED)
    if isinstance(e, RPCTimeoutOrCancelledError):
        return Failure(f"Temporal did not answer in time: {e}", EXIT_FAILED)
    detail = str(e).splitlines()[0] if str(e) else ""
    return Failure(
        f"unexpected error ({type(e).__name__}{': ' + detail if detail else ''}); "
        "run `aiworker --debug ...` for the traceback",
        EXIT_FAILED,
    )


def exit_process(code: int) -> NoReturn:
    """Flush logs and stdio, then exit without interpreter finalization.

    Temporal Core's Rust threads can still call into Python while the
    interpreter finalizes, which aborts a process that has finished its work
    now and then (``Fatal Python error: PyGILState_Release``, exit -6,
    temporalio/sdk-python#300), a drained worker pod included. Any process
    that used a Temporal client ends here; nothing else is left to clean up.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
