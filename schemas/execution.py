"""Where a worker's call runs: ``execution`` in a worker spec.

``"activity"`` (the default): an activity task on the spec's ``task_queue``,
picked up by any process polling it, with its own events in the history.
``"local"``: a Temporal *local activity*, run by the worker process that runs
the pipeline's workflow task, its result recorded as one marker event; no
round trip through the server's task queue, which is how a pipeline of short
CPU-only steps (validator, aggregator) beats a naive workflow of plain
activities.

A local activity runs in the process that runs the workflow, so only a
worker that process serves on the pipelines queue can run local. Holding the
workflow task while it runs, it must also be short and stay off the network.
:func:`execution_problem` refuses every spec for which ``"local"`` could not
work or would hurt; :class:`~aiworker.schemas.spec.WorkerSpec` calls it.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from aiworker.schemas import names

Execution = Literal["activity", "local"]

# The `execution` field of a worker spec.
EXECUTION_FIELD: Any = Field(
    default="activity",
    description='"activity": an activity task on task_queue; "local": a local activity in '
    "the process running the pipeline (short CPU-only workers on the pipelines queue; "
    "AIWORKER_LOCAL_ACTIVITIES=false turns it off)",
)


class _Constraints(Protocol):
    @property
    def timeout_seconds(self) -> float: ...
    @property
    def tools_allowed(self) -> list[str]: ...


class _Spec(Protocol):
    """What of a worker spec decides whether it may run local (spec.py's ``WorkerSpec``)."""

    @property
    def execution(self) -> Execution: ...
    @property
    def kind(self) -> str: ...
    @property
    def task_queue(self) -> str: ...
    @property
    def heartbeat_seconds(self) -> float | None: ...
    @property
    def side_effects(self) -> bool: ...
    @property
    def constraints(self) -> _Constraints: ...


# Tools that reach outside the process (activities/toolbox.py counts each use as
# an external call): a worker that may wait on the network is no local activity.
EXTERNAL_TOOLS = frozenset({"fetch_url", "language_model", "http_post", "render", "mcp"})

# A local activity holds its pipeline's workflow task (signals, queries and
# review updates wait behind it): a worker that may run longer is an activity.
LOCAL_MAX_TIMEOUT_SECONDS = 60.0

_WHY = "a local activity runs inside the worker process that runs the pipeline"


def check_execution(spec: _Spec) -> None:
    """``ValueError`` saying why ``spec`` may not say ``"execution": "local"``."""
    if problem := execution_problem(spec):
        raise ValueError(problem)


def execution_problem(spec: _Spec) -> str | None:
    """Why ``spec`` may not say ``"execution": "local"`` (None: it may, or it does not)."""
    if spec.execution != "local":
        return None
    kind = spec.kind
    if kind == "external":
        return (
            f'execution: "local" is for workers aiworker runs itself ({_WHY}); an external '
            'worker is another process: leave execution out ("activity")'
        )
    if kind == "workflow":
        return 'execution: "local": this worker\'s step runs as a child workflow, not an activity'
    if kind == "prompt":
        return (
            'execution: "local" is for short CPU-only workers; a prompt worker calls a model '
            'over the network: leave execution out ("activity")'
        )
    if spec.task_queue != names.PIPELINES_QUEUE:
        return (
            f'execution: "local" needs task_queue "{names.PIPELINES_QUEUE}" ({_WHY}, which '
            f'polls that queue), not "{spec.task_queue}": a worker on its own queue is served '
            "by the processes polling it; move it to the pipelines queue or leave execution out"
        )
    if spec.heartbeat_seconds is not None:
        return 'execution: "local": a local activity cannot heartbeat; drop heartbeat_seconds'
    if spec.side_effects:
        return (
            'execution: "local": a worker with side_effects runs as an activity (a local '
            "activity runs again when the workflow task that ran it is lost)"
        )
    if spec.constraints.timeout_seconds > LOCAL_MAX_TIMEOUT_SECONDS:
        return (
            f'execution: "local" is for short workers: constraints.timeout_seconds '
            f"{spec.constraints.timeout_seconds:g} is over {LOCAL_MAX_TIMEOUT_SECONDS:g} "
            "(a local activity holds the pipeline's workflow task while it runs)"
        )
    network = sorted(EXTERNAL_TOOLS.intersection(spec.constraints.tools_allowed))
    if network:
        return (
            f'execution: "local" is for CPU-only workers: constraints.tools_allowed names '
            f"{', '.join(network)}, which reach the network"
        )
    return None
