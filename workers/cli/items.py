"""``aiworker items WF_ID STEP_ID``: a for_each step's items as JSON Lines.

Beside :mod:`aiworker.workers.cli.main` (which lists it in its ``COMMANDS``). Above
``AIWORKER_FOREACH_INLINE_ITEMS`` items a step's result holds its items by
reference; this reads them from the artifact store either way
(:meth:`aiworker.workers.client.client.PipelineClient.items`). Failures read as one
line in ``cli.main`` (:func:`aiworker.workers.cli.errors.explain`).
"""

from __future__ import annotations

import argparse
import json
import sys

from aiworker.workers.cli.common import EXIT_OK, pipelines_session


async def cmd_items(args: argparse.Namespace) -> int:
    """``aiworker items WF_ID STEP_ID``: one line of JSON per item (``null`` where one
    failed), in item order, once the pipeline has ended."""
    # The result may sit in external storage, the items in the artifact store;
    # the session closes the S3 connection the store may open.
    async with pipelines_session(
        args, f"aiworker items {args.workflow_id} {args.step_id}", workflow_id=args.workflow_id
    ) as pipelines:
        items = await pipelines.items(args.workflow_id, args.step_id, run_id=args.run_id)
    out = sys.stdout
    for item in items:
        out.write(json.dumps(item, ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
    out.flush()
    return EXIT_OK
