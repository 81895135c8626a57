"""A cost quote before a run (issue #33, ``aiworker check --quote FILE``): pure math.

The caller gives, per step id, the recorded calls of the same worker, version
and model alias (:class:`CallSample`); :func:`quote` multiplies them out over
the ``for_each`` sizes known at check time and returns :class:`Quote`.

Method (docs/cost.md "A quote before a run"): a bootstrap with a fixed seed.
Each of ``draws`` draws resamples, per step and per item, one recorded call
(with replacement). Tokens, external calls and money are sums over every item
of every step; duration is the DAG's critical path, where a ``for_each`` step
runs its items in waves of ``max_parallel`` (a wave lasts as long as its
slowest item) and a step starts when its slowest dependency ends. ``p50`` and
``p95`` are nearest-rank percentiles over the draws. The same history and seed
give the same quote.

What cannot be estimated is listed in ``unknown`` (step, reason) and left out
of the figures, which are then lower bounds: a step whose worker has no
recorded call, a ``for_each`` whose size is not known at check time (a
reference to another step's outputs), a wait step (its callback's delay), and
money for calls recorded without a price.

Written here rather than with a library: a few dozen lines of stdlib
``random``; no Temporal mechanism quotes.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiworker.schemas.pipeline import PipelineSpec, Step, step_dependencies

if TYPE_CHECKING:
    from aiworker.workers.evals.recorded import UnreadableRun

log = logging.getLogger(__name__)

DEFAULT_DRAWS = 2000
DEFAULT_SEED = 33

NO_RECORDED_CALLS = "no_recorded_calls"
FOR_EACH_SIZE_UNKNOWN = "for_each_size_unknown"
WAIT_STEP = "wait_step_duration"
NO_PRICE = "no_price"


@dataclass(frozen=True)
class CallSample:
    """One recorded call of a step's worker (tokens in plus out)."""

    tokens: int
    external_calls: int
    cost_usd: float | None
    duration_s: float


@dataclass(frozen=True)
class Figure:
    p50: float
    p95: float

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p95": self.p95}


@dataclass(frozen=True)
class Unknown:
    step: str
    reason: str
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"step": self.step, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class Quote:
    pipeline: str
    tokens: Figure
    external_calls: Figure
    cost_usd: Figure
    duration_s: Figure
    items: dict[str, int] = field(default_factory=dict)
    unknown: list[Unknown] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "tokens": self.tokens.as_dict(),
            "external_calls": self.external_calls.as_dict(),
            "cost_usd": self.cost_usd.as_dict(),
            "duration_s": self.duration_s.as_dict(),
            "items": dict(self.items),
            "unknown": [u.as_dict() for u in self.unknown],
        }

    def text(self) -> str:
        lines = [f"quote for pipeline {self.pipeline}:"]
        for name in ("tokens", "external_calls", "cost_usd", "duration_s"):
            f: Figure = getattr(self, name)
            lines.append(f"  {name:<15} p50 {_fmt(f.p50):>12}   p95 {_fmt(f.p95):>12}")
        if self.unknown:
            lines.append("not estimated (the figures leave it out):")
            for u in self.unknown:
                tail = f": {u.detail}" if u.detail else ""
                lines.append(f"  step {u.step}: {u.reason}{tail}")
        return "\n".join(lines)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def for_each_size(step: Step, inputs: Mapping[str, Any]) -> int | None:
    """The number of items a step runs: 1 without ``for_each``; a literal list's
    length; a whole ``${{ inputs.<name> }}`` reference to a list in ``inputs``;
    else None (known only at run time)."""
    fe = step.for_each
    if fe is None:
        return 1
    if isinstance(fe, list):
        return len(fe)
    s = fe.strip()
    if s.startswith("${{") and s.endswith("}}"):
        path = s[3:-2].strip().split(".")
        if len(path) >= 2 and path[0] == "inputs":
            v: Any = inputs
            for part in path[1:]:
                if not isinstance(v, Mapping) or part not in v:
                    return None
                v = v[part]
            if isinstance(v, list):
                return len(v)
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def _topological(deps: Mapping[str, set[str]], order: Sequence[str]) -> list[str]:
    done: list[str] = []
    seen: set[str] = set()

    def visit(s: str) -> None:
        if s in seen:
            return
        seen.add(s)
        for d in sorted(deps.get(s, set())):
            visit(d)
        done.append(s)

    for s in order:
        visit(s)
    return done


def quote(
    spec: PipelineSpec,
    history: Mapping[str, Sequence[CallSample]],
    *,
    inputs: Mapping[str, Any] | None = None,
    draws: int = DEFAULT_DRAWS,
    seed: int = DEFAULT_SEED,
) -> Quote:
    """Quote ``spec`` from ``history`` (step id -> recorded calls of its worker,
    version and model). ``inputs`` defaults to the pipeline's own ``inputs``."""
    given = spec.inputs if inputs is None else inputs
    deps = step_dependencies(spec)
    unknown: list[Unknown] = []
    sizes: dict[str, int] = {}
    usable: dict[str, Sequence[CallSample]] = {}
    priced: dict[str, bool] = {}
    for step in spec.steps:
        if step.wait is not None:
            unknown.append(Unknown(step.id, WAIT_STEP, "a wait step lasts until its callback"))
            continue
        n = for_each_size(step, given)
        samples = history.get(step.id, ())
        if not samples:
            unknown.append(
                Unknown(step.id, NO_RECORDED_CALLS, f"worker {step.worker} has no recorded call")
            )
            continue
        if n is None:
            unknown.append(Unknown(step.id, FOR_EACH_SIZE_UNKNOWN, f"for_each {step.for_each!r}"))
            continue
        sizes[step.id] = n
        usable[step.id] = samples
        priced[step.id] = all(s.cost_usd is not None for s in samples)
        if not priced[step.id]:
            unknown.append(
                Unknown(step.id, NO_PRICE, "recorded calls carry no price (model alias unpriced)")
            )
    rng = random.Random(seed)
    order = _topological(deps, [s.id for s in spec.steps])
    by_id = {s.id: s for s in spec.steps}
    tok: list[float] = []
    ext: list[float] = []
    cost: list[float] = []
    dur: list[float] = []
    for _ in range(draws):
        t = e = c = 0.0
        end: dict[str, float] = {}
        for sid in order:
            start = max((end[d] for d in deps.get(sid, set()) if d in end), default=0.0)
            found = usable.get(sid)
            if found is None:
                end[sid] = start
                continue
            n = sizes[sid]
            width = by_id[sid].max_parallel
            picks = [found[rng.randrange(len(found))] for _ in range(n)]
            for p in picks:
                t += p.tokens
                e += p.external_calls
                if priced[sid] and p.cost_usd is not None:
                    c += p.cost_usd
            elapsed = 0.0
            for w in range(0, n, width):
                elapsed += max(p.duration_s for p in picks[w : w + width])
            end[sid] = start + elapsed
        tok.append(t)
        ext.append(e)
        cost.append(c)
        dur.append(max(end.values(), default=0.0))

    def fig(v: list[float]) -> Figure:
        return Figure(percentile(v, 50), percentile(v, 95))

    return Quote(
        pipeline=spec.name,
        tokens=fig(tok),
        external_calls=fig(ext),
        cost_usd=fig(cost),
        duration_s=fig(dur),
        items=sizes,
        unknown=unknown,
    )


# --- history and the start gate ------------------------------------------------

HISTORY_LIMIT = 200
"""Recorded calls read per worker (the most recent): enough for a p95."""
START_HISTORY_LIMIT = 50
"""Recorded calls read per worker when a start is quoted (it waits for it)."""
READ_SECONDS = 10.0
"""How long reading one worker's history may take; what was read by then is used."""


def sample_of(call: Any) -> CallSample:
    """A :class:`CallSample` from a ``RecordedCall`` of the evals reader."""
    usage = call.usage if isinstance(call.usage, Mapping) else {}
    tokens = usage.get("total_tokens")
    if tokens is None:
        tokens = int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
    return CallSample(
        tokens=int(tokens or 0),
        external_calls=int(call.external_calls or 0),
        cost_usd=float(call.cost_usd),
        duration_s=float(call.duration_ms or 0) / 1000,
    )


def _step_model(step: Step) -> str | None:
    model = step.input.get("model") if isinstance(step.input, dict) else None
    return model if isinstance(model, str) and "${{" not in model else None


async def step_history(
    client: Any,
    spec: PipelineSpec,
    *,
    limit: int = HISTORY_LIMIT,
    unreadable: list[UnreadableRun] | None = None,
) -> dict[str, list[CallSample]]:
    """Step id -> recorded successful calls of its worker (of the step's model
    alias when its input names one literally), for the pipeline's tenant, read
    with the evals reader (:mod:`aiworker.workers.evals.recorded`): at most
    ``limit`` calls per worker, newest runs first, the workers read at once,
    each within :data:`READ_SECONDS`.

    A run whose payloads this process cannot read (another stack's artifact
    store) is left out of the quote, never its end: it is appended to
    ``unreadable`` when given (the caller says so), else logged."""
    import asyncio

    from aiworker.workers.evals.recorded import (
        CallQuery,
        RecordedCall,
        recorded_calls,
    )

    skipped: list[UnreadableRun] = [] if unreadable is None else unreadable

    async def read_worker(worker: str) -> list[RecordedCall]:
        calls: list[RecordedCall] = []
        query = CallQuery(worker=worker, tenant=spec.tenant, status="succeeded", limit=limit)
        try:
            async with asyncio.timeout(READ_SECONDS):
                async for call in recorded_calls(client, query, unreadable=skipped):
                    calls.append(call)
        except TimeoutError:
            pass  # bounded: quote from what was read
        return calls

    steps = [s for s in spec.steps if s.wait is None and s.worker]
    # each worker once, all at the same time: a start waits READ_SECONDS at most
    workers = sorted({str(s.worker) for s in steps})
    read = dict(zip(workers, await asyncio.gather(*map(read_worker, workers)), strict=True))
    if skipped and unreadable is None:
        first = skipped[0]
        log.warning(
            "quote of %s left out %d recorded run(s) whose payloads cannot be read here; "
            "first: %s (%s: %s)",
            spec.name,
            len(skipped),
            first.workflow_id,
            first.code,
            first.message,
        )
    out: dict[str, list[CallSample]] = {}
    for step in steps:
        model = _step_model(step)
        out[step.id] = [
            sample_of(c) for c in read[str(step.worker)] if model is None or c.model == model
        ]
    return out


def over_threshold(q: Quote, threshold: float | None) -> bool:
    """Whether a start quoted ``q`` needs an explicit accept under ``threshold``:
    its p95 cost is above it. A quote that estimated no step (no history) has
    no cost to hold against it and does not block."""
    if threshold is None or estimated_nothing(q):
        return False
    return q.cost_usd.p95 > threshold


def estimated_nothing(q: Quote) -> bool:
    """No step of the quote was estimated (each one is in ``unknown``)."""
    return not q.items
