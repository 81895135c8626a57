"""``aiworker check --quote FILE [--json]``: a cost quote before a run (issue #33).

The pipeline is checked first exactly as ``aiworker check`` does (exit 2 on a
bad file). The history of each step's worker comes from the evals helper's
reader, ``aiworker.workers.evals.recorded.recorded_calls`` (one history reader
in the code base), through :func:`aiworker.workers.quote.step_history`; the math
is :func:`aiworker.workers.quote.quote`. Without a reachable Temporal it quotes
nothing and says so (every step ``unknown``, one line on stderr).
"""

from __future__ import annotations

import argparse
import json

from aiworker.schemas.pipeline import PipelineSpec
from aiworker.workers.cli.common import (
    EXIT_OK,
    checked_pipeline,
    command_settings,
    command_view,
    err,
    load_pipeline_file,
)
from aiworker.workers.quote import CallSample, quote, step_history


async def history_for(args: argparse.Namespace, spec: PipelineSpec) -> dict[str, list[CallSample]]:
    """The quote's history, read from the Temporal this command talks to."""
    from aiworker.workers.cli.common import command_client
    from aiworker.workers.client.temporal_client import TemporalUnreachableError
    from aiworker.workers.evals.recorded import UnreadableRun

    try:
        client = await command_client(args)
    except TemporalUnreachableError as e:
        # the quote still names every step it cannot estimate
        err(f"cannot reach Temporal ({e}): no recorded calls to quote from")
        return {}
    unreadable: list[UnreadableRun] = []
    history = await step_history(client, spec, unreadable=unreadable)
    if unreadable:
        # the quote stands on the runs it could read; say which it could not
        first = unreadable[0]
        err(
            f"left out {len(unreadable)} recorded run(s) whose payloads this process "
            f"cannot read (first: {first.workflow_id}, {first.code}): set AIWORKER_DATA_DIR "
            "or AIWORKER_ARTIFACT_STORE to the store the workers write"
        )
    return history


async def cmd_check_quote(args: argparse.Namespace) -> int:
    """Print the quote (text, or ``--json``); exit 2 when the pipeline is invalid."""
    raw = load_pipeline_file(args.file)
    view = await command_view(args)
    checked = checked_pipeline(raw, args.file, command_settings(args), view)
    spec = PipelineSpec.model_validate(checked)
    q = quote(spec, await history_for(args, spec))
    if args.json:
        print(json.dumps(q.as_dict(), indent=2))
    else:
        print(q.text())
    return EXIT_OK
