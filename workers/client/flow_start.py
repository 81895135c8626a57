"""Flow control at the one start path every client shares (:meth:`PipelineClient.start`).

So far this enforces ``"singleton": "refuse"`` only, with Temporal's own
primitive: the run's workflow id is derived from (tenant, pipeline, key) and
started with ``WorkflowIDConflictPolicy.FAIL``, so the server refuses a second
start while a run holds the key (``temporal workflow start --id ...
--id-conflict-policy Fail`` does the same). The other modes (debounce, batch,
singleton wait/cancel_running, throttle) need the keyed flow workflow that is
not built yet: a pipeline declaring one is refused at start with a clear
message rather than started without its flow control.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio.common import WorkflowIDConflictPolicy

from aiworker.schemas import names
from aiworker.schemas.flow import Flow, FlowKeyError, flow_workflow_id, resolve_key
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.schemas.problems import Problem

ENFORCED: tuple[str, ...] = ("singleton:refuse",)
"""The flow modes this build enforces; any other is refused at start."""


@dataclass(frozen=True)
class FlowStart:
    """How a start with flow control is made: the keyed workflow id and its policy."""

    mode: str
    key: str
    workflow_id: str
    id_conflict_policy: WorkflowIDConflictPolicy


class FlowRefusedError(RuntimeError):
    """``singleton: refuse``: a run already holds the key; nothing was started.

    Attributes:
        workflow_id: the id of the run holding the key.
        run_id: its run id, when the server said.
    """

    code = "flow_refused"

    def __init__(self, key: str, workflow_id: str, run_id: str | None) -> None:
        self.key = key
        self.workflow_id = workflow_id
        self.run_id = run_id
        super().__init__(f"refused: run {workflow_id} holds flow key {key!r} (singleton: refuse)")


def plan_flow_start(pipeline: Mapping[str, Any]) -> FlowStart | None:
    """The flow-controlled start of ``pipeline``, or None when it declares no ``flow``.

    Raises:
        PipelineSpecError: ``flow`` is invalid, its key resolves to nothing or to
            over 200 characters, or it names a mode this build does not enforce
            (bad input: nothing was started).
    """
    raw = pipeline.get("flow")
    if raw is None:
        return None
    try:
        flow = Flow.model_validate(raw)
    except ValidationError as e:
        raise PipelineSpecError([Problem(None, "flow", str(e))]) from e
    inputs = pipeline.get("inputs") or {}
    try:
        key = resolve_key(flow, dict(inputs) if isinstance(inputs, Mapping) else {})
    except FlowKeyError as e:
        raise PipelineSpecError([Problem(None, "flow.key", str(e))]) from e
    mode = flow.modes()[0]
    if mode == "singleton":
        mode = f"singleton:{flow.singleton}"
    if mode not in ENFORCED:
        raise PipelineSpecError(
            [Problem(None, "flow", f"flow mode {mode} is not enforced by this build yet")]
        )
    tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
    name = str(pipeline.get("name") or "pipeline")
    return FlowStart(
        mode=mode,
        key=key,
        workflow_id=flow_workflow_id(tenant, name, key),
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
