"""A test-only workflow that calls one activity on a given task queue.

Deploy tests use it to send an activity to a worker running elsewhere (a
Lambda handler, a worker subprocess) and read the attempt from the history.
Not sandboxed: it is test scaffolding, and its only work is one activity call.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy


@workflow.defn(name="DeployProbeWorkflow", sandboxed=False)
class DeployProbeWorkflow:
    """Run activity ``args["activity"]`` on ``args["task_queue"]`` once; return its result."""

    @workflow.run
    async def run(self, args: dict[str, Any]) -> Any:
        return await workflow.execute_activity(
            args["activity"],
            args["request"],
            task_queue=args["task_queue"],
            start_to_close_timeout=timedelta(seconds=args.get("timeout_seconds", 30)),
            retry_policy=RetryPolicy(maximum_attempts=args.get("max_attempts", 1)),
        )
