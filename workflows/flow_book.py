"""The decisions of the keyed flow workflow, as pure code: a start in, an answer out.

:class:`FlowBook` holds one key's flow state (:class:`~aiworker.schemas.flow_state.FlowState`)
and decides, from a start and the workflow's time only, what the caller is told
and which run starts when. It calls no Temporal API: ``workflows/flow.py`` feeds
it the ``start`` updates, the workflow clock and the closing of runs, and starts
the runs it hands back (:class:`Launch`), so every decision is a function of the
history, and the rules are tested here without a server
(``tests/workflows/test_flow_book.py``).

One mode per key (``docs/flow-control.md``):

- ``debounce``: the first start opens a run (``queued``), every later start in
  the quiet period joins it (``collapsed``); it starts once the key was quiet
  ``seconds``, at the latest ``max_wait_seconds`` after its first start, with the
  latest start's pipeline (``inputs: all``: every start's inputs as
  ``inputs.starts``);
- ``batch``: the same collection, started at ``max_items`` starts (that start is
  ``started``) or ``max_seconds`` after the first;
- ``singleton: wait``: a start while a run is running (or others wait) queues for
  a run of its own, started in order as each closes;
- ``singleton: cancel_running``: a start while a run is running asks that run's
  cancellation and waits as the next run; later starts replace the next run's
  pipeline (``collapsed``) until it starts;
- ``throttle``: at most ``max_starts`` runs start per ``period_seconds`` (a window
  sliding over the start times); the rest queue in order, none is dropped.

Bounds (``refusal``): at most :data:`~aiworker.schemas.flow_state.MAX_QUEUED_RUNS`
runs waiting, :data:`~aiworker.schemas.flow_state.MAX_PENDING_BYTES` of pipelines
held; a start past either is refused (``flow_refused``), and so is a start that
changes the mode while the old mode still has runs to start or running.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.flow import Flow, collects, mode_of, run_inputs
    from aiworker.schemas.flow_state import (
        MAX_COLLECTED_STARTS,
        MAX_PENDING_BYTES,
        MAX_QUEUED_RUNS,
        MAX_REMEMBERED_ANSWERS,
        FlowAnswer,
        FlowRequest,
        FlowState,
        PendingRun,
    )


@dataclass(frozen=True)
class Launch:
    """A run to start now: its id, the pipeline it starts with, its UI summary."""

    run: PendingRun
    pipeline: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class Decision:
    """What one start did: the caller's answer; a run to start now (the answer's
    ``run_id`` is set once it started); a running run whose cancellation to ask."""

    answer: FlowAnswer
    launch: Launch | None = None
    cancel: str | None = None


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), sort_keys=True, default=str))


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class FlowBook:
    """One key's flow state and the rules of its mode (see the module docstring)."""

    def __init__(self, state: FlowState, flow_workflow_id: str, generation: str) -> None:
        self.flow_workflow_id = flow_workflow_id
        self.tenant, self.pipeline, self.key = state.tenant, state.pipeline, state.key
        self.flow: Flow = state.flow
        self.generation = state.generation or generation
        self.seq = state.seq
        self.pending: list[PendingRun] = list(state.pending)
        self.window: list[float] = list(state.window)
        self.counts = {"started": state.started, "collapsed": state.collapsed}
        self.counts["queued"] = state.queued
        self.answered: dict[str, FlowAnswer] = dict(state.answered)
        # singleton: the run started and not closed yet, and whether its cancel was asked
        self.running: str | None = None
        self.cancelling = False
        # bytes each pending run holds: (its pipeline, its collected inputs), kept as
        # starts come so that the bound costs a start its own size, not all held
        self._sizes: dict[str, tuple[int, int]] = {
            p.workflow_id: (_size(p.pipeline), _size(p.collected)) for p in self.pending
        }

    # -- what the workflow asks ---------------------------------------------------

    def state(self) -> FlowState:
        """What continue-as-new carries (never while a singleton run is running)."""
        return FlowState(
            tenant=self.tenant,
            pipeline=self.pipeline,
            key=self.key,
            flow=self.flow,
            generation=self.generation,
            seq=self.seq,
            pending=self.pending,
            window=self.window,
            answered=self.answered,
            **self.counts,
        )

    def answer_of(self, update_id: str | None) -> FlowAnswer | None:
        """The answer already given to the start with this update id, if one was
        (in this run or, carried, in the run before it)."""
        return self.answered.get(update_id) if update_id else None

    def remember(self, update_id: str | None, answer: FlowAnswer) -> None:
        """Keep ``answer`` for a start sent again with the same update id."""
        if not update_id:
            return
        self.answered[update_id] = answer
        while len(self.answered) > MAX_REMEMBERED_ANSWERS:
            del self.answered[next(iter(self.answered))]

    @property
    def mode(self) -> str:
        return mode_of(self.flow)

    def idle(self, now: float) -> bool:
        """Nothing to start, nothing running, no throttle window open."""
        self._prune(now)
        return not self.pending and self.running is None and not self.window

    def wake_at(self, now: float) -> float | None:
        """When :meth:`due` next has something to start by time alone (None: only a
        start or a run's close changes anything)."""
        flow = self.flow
        if not self.pending:
            # an empty window (no start yet, or all past the period) frees nothing later
            return (
                self.window[0] + flow.throttle.period_seconds
                if flow.throttle and self.window
                else None
            )
        if flow.debounce is not None or flow.batch is not None:
            return self._due_at(self.pending[0])
        if flow.throttle is not None and self.window:
            return self.window[0] + flow.throttle.period_seconds
        return None

    def refusal(self, request: FlowRequest, now: float) -> str | None:
        """Why this start is refused (the ``start`` update's validator: no history
        written), or None."""
        if request.key != self.key:
            return f"flow key {request.key!r} is not this flow workflow's ({self.key!r})"
        try:
            flow = Flow.model_validate(request.pipeline.get("flow"))
        except ValueError as e:
            return f"invalid flow: {e}"
        mode = mode_of(flow)
        if mode != self.mode and (self.pending or self.running is not None):
            return (
                f"flow mode changed from {self.mode} to {mode} while runs of key "
                f"{self.key!r} are pending or running; start again once they have started"
            )
        if self._opens_run(flow) and len(self.pending) >= MAX_QUEUED_RUNS:
            return (
                f"{MAX_QUEUED_RUNS} runs of key {self.key!r} are queued already "
                f"({self.mode}); start again once some have started"
            )
        held = sum(a + b for a, b in self._sizes.values())
        if held + _size(request.pipeline) > MAX_PENDING_BYTES:
            return (
                f"the starts held for key {self.key!r} would pass {MAX_PENDING_BYTES} bytes; "
                "start again once some have started"
            )
        return None

    def submit(self, request: FlowRequest, now: float) -> Decision:
        """Take one start (already admitted by :meth:`refusal`)."""
        self.flow = Flow.model_validate(request.pipeline.get("flow"))
        self._prune(now)
        if self.flow.debounce is not None or self.flow.batch is not None:
            return self._collect(request, now)
        if self.flow.throttle is not None:
            return self._throttle(request, now)
        return self._singleton(request, now)

    def due(self, now: float) -> list[Launch]:
        """The runs to start now (a debounce gone quiet, a batch's deadline, a
        singleton's next once the running one closed, free throttle slots)."""
        self._prune(now)
        flow = self.flow
        out: list[Launch] = []
        if flow.debounce is not None or flow.batch is not None:
            if self.pending and now >= self._due_at(self.pending[0]):
                out.append(self._launch(self.pending.pop(0), now))
        elif flow.throttle is not None:
            while self.pending and len(self.window) < flow.throttle.max_starts:
                out.append(self._launch(self.pending.pop(0), now))
        elif self.running is None and self.pending:
            out.append(self._launch(self.pending.pop(0), now))
        return out

    def closed(self, workflow_id: str) -> None:
        """A singleton run closed (any way): the next may start."""
        if self.running == workflow_id:
            self.running, self.cancelling = None, False

    # -- the modes ----------------------------------------------------------------

    def _collect(self, request: FlowRequest, now: float) -> Decision:
        """debounce and batch: join the open run, or open one."""
        inputs = request.pipeline.get("inputs") or {}
        keep = collects(self.flow)
        if self.pending:
            run = self.pending[0]
            run = run.model_copy(
                update={
                    "pipeline": request.pipeline,
                    "collected": [*run.collected, inputs] if keep else [],
                    "count": run.count + 1,
                    "last_at": now,
                    **self._priority(request),
                }
            )
            self.pending[0] = run
            _, collected = self._sizes.get(run.workflow_id, (0, 0))
            added = _size(inputs) + 1 if keep else 0
            self._sizes[run.workflow_id] = (_size(request.pipeline), collected + added)
            status = "collapsed"
            self.counts["collapsed"] += 1
        else:
            run = self._new_run(request, now, [inputs] if keep else [])
            self.pending.append(run)
            status = "queued"
            self.counts["queued"] += 1
        full = (self.flow.batch is not None and run.count >= self.flow.batch.max_items) or (
            keep and run.count >= MAX_COLLECTED_STARTS
        )
        if full:
            self.pending.pop(0)
            launch = self._launch(run, now)
            reason = f"{self._rule()}; started now with {_plural(run.count, 'start')}"
            return Decision(self._answer("started", run, reason), launch)
        if status == "queued" and self.flow.batch is not None:
            reason = f"{self._rule()}; starts at {_when(self._due_at(run))} at the latest"
        elif status == "queued":
            reason = f"{self._rule()}; starts at {_when(self._due_at(run))} unless another comes"
        else:
            reason = f"{self._rule()}; {_plural(run.count, 'start')} so far"
        return Decision(self._answer(status, run, reason, starts_at=self._due_at(run)))

    def _singleton(self, request: FlowRequest, now: float) -> Decision:
        """singleton wait and cancel_running."""
        if self.running is None and not self.pending:
            run = self._new_run(request, now)
            return Decision(self._answer("started", run, self._rule()), self._launch(run, now))
        if self.flow.singleton == "cancel_running" and self.pending:
            nxt = self.pending[0].model_copy(
                update={
                    "pipeline": request.pipeline,
                    "count": self.pending[0].count + 1,
                    "last_at": now,
                    **self._priority(request),
                }
            )
            self.pending[0] = nxt
            self._sizes[nxt.workflow_id] = (_size(request.pipeline), 0)
            self.counts["collapsed"] += 1
            reason = (
                "singleton: cancel_running: the next run starts with this start's pipeline "
                f"once {self.running or 'the running run'} has closed"
            )
            return Decision(self._answer("collapsed", nxt, reason, behind=self.running))
        behind = self.pending[-1].workflow_id if self.pending else self.running
        run = self._new_run(request, now)
        self.pending.append(run)
        self.counts["queued"] += 1
        if self.flow.singleton == "cancel_running":
            cancel = None if self.cancelling else self.running
            self.cancelling = True
            reason = (
                f"singleton: cancel_running: {behind} is asked to cancel; this start runs "
                "once it has closed"
            )
            return Decision(self._answer("queued", run, reason, behind=behind), cancel=cancel)
        ahead = len(self.pending) - 1
        reason = f"singleton: wait: starts when {behind} has closed"
        if ahead:
            reason += f", after {_plural(ahead, 'other queued start')}"
        return Decision(self._answer("queued", run, reason, behind=behind))

    def _throttle(self, request: FlowRequest, now: float) -> Decision:
        """At most max_starts per period_seconds (sliding window); the rest queue."""
        rule = self.flow.throttle
        run = self._new_run(request, now)
        if rule is not None and not self.pending and len(self.window) < rule.max_starts:
            return Decision(self._answer("started", run, self._rule()), self._launch(run, now))
        self.pending.append(run)
        self.counts["queued"] += 1
        at = self.slots(now)[-1]
        ahead = len(self.pending) - 1
        reason = f"{self._rule()}: starts at {_when(at)}"
        if ahead:
            reason += f", after {_plural(ahead, 'other queued start')}"
        return Decision(self._answer("queued", run, reason, starts_at=at))

    def slots(self, now: float) -> list[float]:
        """throttle: when each pending run starts, in order (epoch seconds), if no
        other start comes first: each takes the slot freed by the start
        ``max_starts`` before it, one period later."""
        rule = self.flow.throttle
        if rule is None:
            return []
        seq = sorted(self.window)
        out = []
        for _ in self.pending:
            i = len(seq) - rule.max_starts
            at = now if i < 0 else max(now, seq[i] + rule.period_seconds)
            seq.append(at)
            out.append(at)
        return out

    # -- helpers ------------------------------------------------------------------

    def _opens_run(self, flow: Flow) -> bool:
        """Whether a start of ``flow`` may add a waiting run (the queue bound)."""
        return flow.throttle is not None or flow.singleton == "wait"

    def _rule(self) -> str:
        f = self.flow
        if f.debounce is not None:
            d = f.debounce
            text = f"debounce: starts once key {self.key!r} has been quiet {d.seconds} s"
            if d.max_wait_seconds is not None:
                text += f", at most {d.max_wait_seconds} s after its first start"
            return text
        if f.batch is not None:
            b = f.batch
            return (
                f"batch: starts at {b.max_items} starts for key {self.key!r} "
                f"or {b.max_seconds} s after the first"
            )
        if f.throttle is not None:
            t = f.throttle
            return f"throttle: {_plural(t.max_starts, 'start')} per {t.period_seconds} s"
        return f"singleton: {f.singleton}: at most one run of key {self.key!r} at a time"

    def _due_at(self, run: PendingRun) -> float:
        f = self.flow
        if f.batch is not None:
            return run.first_at + f.batch.max_seconds
        if f.debounce is None:
            return run.first_at
        due = run.last_at + f.debounce.seconds
        if f.debounce.max_wait_seconds is not None:
            due = min(due, run.first_at + f.debounce.max_wait_seconds)
        return due

    def _prune(self, now: float) -> None:
        period = self.flow.throttle.period_seconds if self.flow.throttle else 0
        self.window = [t for t in self.window if t + period > now]

    def _new_run(
        self, request: FlowRequest, now: float, collected: list[dict[str, Any]] | None = None
    ) -> PendingRun:
        self.seq += 1
        wid = f"{self.flow_workflow_id}/{self.generation}-{self.seq}"
        self._sizes[wid] = (_size(request.pipeline), _size(collected or []))
        return PendingRun(
            workflow_id=wid,
            pipeline=request.pipeline,
            collected=collected or [],
            first_at=now,
            last_at=now,
            **self._priority(request),
        )

    @staticmethod
    def _priority(request: FlowRequest) -> dict[str, Any]:
        return {
            "priority_key": request.priority_key,
            "fairness_key": request.fairness_key,
            "fairness_weight": request.fairness_weight,
        }

    def _answer(
        self,
        status: str,
        run: PendingRun,
        reason: str,
        *,
        behind: str | None = None,
        starts_at: float | None = None,
    ) -> FlowAnswer:
        return FlowAnswer.model_validate(
            {
                "status": status,
                "workflow_id": run.workflow_id,
                "reason": reason,
                "flow_workflow_id": self.flow_workflow_id,
                "behind": behind,
                "starts_at": starts_at,
                "starts": run.count,
            }
        )

    def _launch(self, run: PendingRun, now: float) -> Launch:
        """Start ``run`` now: the pipeline it gets, its summary; counted."""
        self._sizes.pop(run.workflow_id, None)
        pipeline = dict(run.pipeline)
        inputs = pipeline.get("inputs") or {}
        pipeline["inputs"] = run_inputs(inputs, run.collected if collects(self.flow) else None)
        self.counts["started"] += 1
        if self.flow.throttle is not None:
            self.window.append(now)
        if self.flow.singleton is not None:
            self.running, self.cancelling = run.workflow_id, False
        name = pipeline.get("name") or self.pipeline
        tenant = pipeline.get("tenant") or self.tenant
        summary = (
            f"pipeline {name} (tenant {tenant}) · flow {self.mode} key {self.key}: "
            f"{_plural(run.count, 'start')}"
        )
        return Launch(run=run, pipeline=pipeline, summary=summary)

    # -- what people see ----------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        """The ``state`` query's answer: the mode, what is pending and running."""
        slots = self.slots(now) if self.flow.throttle is not None else []
        pending = []
        for i, run in enumerate(self.pending):
            at: float | None = slots[i] if slots else None
            if self.flow.debounce is not None or self.flow.batch is not None:
                at = self._due_at(run)
            pending.append({"workflow_id": run.workflow_id, "starts": run.count, "starts_at": at})
        return {
            "mode": self.mode,
            "key": self.key,
            "pending": pending,
            "running": self.running,
            "window": len(self.window),
            **self.counts,
        }

    def details(self, now: float) -> str:
        """The Temporal UI's current details: a short Markdown list."""
        lines = [f"**flow** {self._rule()}"]
        if self.running is not None:
            cancel = " (cancel asked)" if self.cancelling else ""
            lines.append(f"- running: `{self.running}`{cancel}")
        for row in self.view(now)["pending"][:20]:
            when = f", starts at {_when(row['starts_at'])}" if row["starts_at"] else ""
            lines.append(f"- next: `{row['workflow_id']}`: {_plural(row['starts'], 'start')}{when}")
        if len(self.pending) > 20:
            lines.append(f"- and {len(self.pending) - 20} more queued (query `state`)")
        c = self.counts
        lines.append(
            f"- runs started {c['started']} · starts collapsed {c['collapsed']} · "
            f"queued {c['queued']}"
        )
        return "\n".join(lines)


__all__ = ["Decision", "FlowBook", "Launch"]
