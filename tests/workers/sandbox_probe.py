"""Test-only workflows for the production sandbox (``workflow_runner()``).

This module is not passed through, so the sandbox imports it afresh for each
run and checks what its code calls: ``ClockProbeWorkflow`` reads the wall
clock, which the sandbox must refuse.
"""

from __future__ import annotations

import datetime

from temporalio import workflow


@workflow.defn(name="ClockProbeWorkflow")
class ClockProbeWorkflow:
    """Reads ``datetime.now()`` in workflow code: a determinism error."""

    @workflow.run
    async def run(self) -> str:
        return datetime.datetime.now().isoformat()
