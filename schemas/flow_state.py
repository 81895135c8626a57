"""The keyed flow workflow's contract: a start sent to it, its answer, its carried state.

One ``PipelineFlowWorkflow`` per (tenant, pipeline, key) (``workflows/flow.py``)
receives every start of a pipeline that declares a ``flow`` other than
``singleton: refuse`` as its ``start`` update (sent with update-with-start by
``workers/client/flow_start.py``), answers each synchronously with a
:class:`FlowAnswer`, and carries what is still to start across continue-as-new
as a :class:`FlowState`.

The models ignore unknown fields (``extra="ignore"``), like the live registry's:
the flow workflow auto-upgrades to each new build, so a build may read a state
or a request written by a newer one (after a rollback) and must keep what it
understands.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from aiworker.schemas.flow import Flow

MAX_QUEUED_RUNS: Final = 100
"""Runs waiting to start for one key (singleton ``wait``, ``throttle``); a start past
this is refused (``flow_refused``), never dropped silently."""
MAX_PENDING_BYTES: Final = 1_000_000
"""The JSON of every pipeline and collected input a key's flow workflow holds; a
start past this is refused (``flow_refused``). Bounds the continue-as-new input
under Temporal's 2 MB payload limit."""
MAX_COLLECTED_STARTS: Final = 1_000
"""Starts one run collects (``debounce`` with ``inputs: all``): at this many the run
starts at once and the next start opens a new one."""
MAX_HISTORY_EVENTS = 2_000
"""The flow workflow continues as new past this many history events (or when the
server suggests it), carrying its :class:`FlowState`."""
MAX_REMEMBERED_ANSWERS: Final = 32
"""Answers to the latest starts a flow workflow keeps by update id, across
continue-as-new: a start the previous run answered whose answer never reached its
caller (the run continued as new first) is sent again to the next run with the same
id, and gets that answer instead of counting twice. The server lets 10 updates be
in flight per workflow, so 32 covers every start a continue-as-new can cut off."""
IDLE_SECONDS: Final = 60.0
"""A flow workflow with nothing to start, nothing running and no throttle window
open completes after this long without a start (the next start starts it again)."""

FlowStatus = Literal["started", "collapsed", "queued"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FlowRequest(_Open):
    """One start of a flow-controlled pipeline, as the client sends it.

    Attributes:
        pipeline: the pipeline JSON of this start (the key already resolved from it).
        key: the resolved key (:func:`~aiworker.schemas.flow.resolve_key`).
        priority_key, fairness_key, fairness_weight: the Temporal Priority the
            run starts with (the client's :func:`~aiworker.schemas.priority.start_priority`).
    """

    pipeline: dict[str, Any]
    key: str
    priority_key: int | None = None
    fairness_key: str | None = None
    fairness_weight: float | None = None


class FlowAnswer(_Open):
    """What the flow workflow did with one start: the caller's answer.

    Attributes:
        status: ``started`` (this start began its run now), ``collapsed`` (merged
            into a run that other starts also feed), ``queued`` (its run starts
            later: after a quiet period, a batch, the running run, a throttle slot).
        workflow_id: the run that will do (or does) the work.
        run_id: that run's run id, once it started.
        reason: why, in one sentence (what `aiworker run` and the front door show).
        flow_workflow_id: the keyed flow workflow that decided.
        behind: the run this start waits for (singleton), if any.
        starts_at: epoch seconds at which the run starts at the latest, when known
            now (a debounce may start it later only if another start comes; a
            throttle slot; a batch's deadline).
        starts: how many starts the run has collected so far (this one included).
    """

    status: FlowStatus
    workflow_id: str
    run_id: str | None = None
    reason: str
    flow_workflow_id: str
    behind: str | None = None
    starts_at: float | None = None
    starts: int = Field(default=1, ge=1)


class PendingRun(_Open):
    """A run the flow workflow will start: its id is fixed when the first start for
    it arrives (so the caller is told it), its pipeline is the latest start's.

    Attributes:
        workflow_id: the run's workflow id (``<flow workflow id>/<generation>-<n>``).
        pipeline: the pipeline JSON it starts with (the latest start's).
        collected: every start's inputs, oldest first (``debounce`` ``inputs: all``,
            ``batch``); empty otherwise.
        count: how many starts it took (``collected`` or not).
        first_at, last_at: epoch seconds of its first and latest start.
        priority_key, fairness_key, fairness_weight: the latest start's Priority.
    """

    workflow_id: str
    pipeline: dict[str, Any]
    collected: list[dict[str, Any]] = Field(default_factory=list)
    count: int = 1
    first_at: float
    last_at: float
    priority_key: int | None = None
    fairness_key: str | None = None
    fairness_weight: float | None = None


class FlowState(_Open):
    """What a flow workflow starts with, and carries across continue-as-new.

    Attributes:
        tenant, pipeline, key: whose starts these are (the workflow id says so too).
        flow: the declaration of the latest start (a later start may change the
            mode's numbers; a different mode waits until nothing is pending).
        generation: a short random part of every run id this chain of flow
            workflows starts (a later chain for the same key never reuses an id).
        seq: the number of the last run id handed out.
        pending: runs to start, oldest first: the open group (``debounce``,
            ``batch``: at most one), the queue (singleton ``wait``: in order;
            ``cancel_running``: at most one; ``throttle``: in order).
        window: epoch seconds of the runs started within the throttle period.
        started, collapsed, queued: counters for the UI since the chain began.
        answered: the latest starts' answers by update id, oldest first (at most
            :data:`MAX_REMEMBERED_ANSWERS`).
    """

    tenant: str
    pipeline: str
    key: str
    flow: Flow
    generation: str = ""
    seq: int = 0
    pending: list[PendingRun] = Field(default_factory=list)
    window: list[float] = Field(default_factory=list)
    started: int = 0
    collapsed: int = 0
    queued: int = 0
    answered: dict[str, FlowAnswer] = Field(default_factory=dict)


__all__ = [
    "IDLE_SECONDS",
    "MAX_COLLECTED_STARTS",
    "MAX_HISTORY_EVENTS",
    "MAX_PENDING_BYTES",
    "MAX_QUEUED_RUNS",
    "MAX_REMEMBERED_ANSWERS",
    "FlowAnswer",
    "FlowRequest",
    "FlowState",
    "FlowStatus",
    "PendingRun",
]
