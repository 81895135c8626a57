"""A test-only workflow that runs the garbage collector inside its own workflow task.

Finalizers of coroutines that a stopped worker abandoned run wherever the
collector happens to run; here, deliberately, on a workflow task thread while
this run's event loop is the running one (``test_abandoned_runs.py``).
"""

from __future__ import annotations

import gc

from temporalio import workflow


@workflow.defn(name="CollectorProbeWorkflow")
class CollectorProbeWorkflow:
    """Collects garbage in its first workflow task, then ends."""

    @workflow.run
    async def run(self) -> int:
        with workflow.unsafe.sandbox_unrestricted():
            return gc.collect()
