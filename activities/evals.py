"""The ``eval-call`` activity: one call of a candidate prompt worker given by its spec.

An eval run (workflows/evals.py) calls a candidate that no process serves under
its own name yet: a new version of a prompt worker's spec file, or the recorded
worker with another model alias. This activity builds the
:class:`~aiworker.activities.prompt.PromptWorker` of the spec it is given and
runs it through the process's :class:`~aiworker.activities.runtime.WorkerRuntime`,
so the call has the candidate's own contract (its input and output schemas),
constraints and error codes, and the process's tools (the model registry, its
endpoint rate limits and breakers). It is registered on every task queue that
serves a prompt worker or ``llm-call`` (workers/process/task_queues.py), so the
candidate runs where the worker it replaces runs.
"""

from __future__ import annotations

from temporalio import activity

from aiworker.activities.errors import InvalidInputError
from aiworker.activities.prompt import PromptWorker
from aiworker.activities.runtime import WorkerRuntime
from aiworker.schemas import names
from aiworker.schemas.evals import EvalCall
from aiworker.schemas.protocol import WorkerResponse
from aiworker.schemas.spec import PromptImplementation


class EvalActivities:
    """The eval activities of one process.

    Args:
        runtime: the process's worker runtime (tools, contracts, settings).
    """

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    @activity.defn(name=names.EVAL_CALL)
    async def call(self, call: EvalCall) -> WorkerResponse:
        """Run the prompt worker ``call.spec`` on ``call.request`` (one attempt)."""
        spec = call.spec
        if not isinstance(spec.implementation, PromptImplementation):
            raise InvalidInputError(
                f"worker {spec.worker_id!r} is a {spec.kind} worker: an eval runs only "
                "prompt workers from a spec (name the queue of another kind's processes)",
                field="candidate",
            ).to_application_error(spec.worker_id, activity.info().attempt)
        return await self.runtime.run(PromptWorker(spec), call.request)
