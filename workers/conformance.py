"""The conformance kit: check a live worker against its spec, through Temporal.

``aiworker conformance WORKER_ID`` and :func:`check_worker` (one line in a
test) send requests to a worker that some worker process serves, exactly as a
pipeline would: by activity name on the spec's task queue (plus the
deployment's ``AIWORKER_TASK_QUEUE_SUFFIX``), with the activity options
derived from the spec. The calls run in :class:`ConformanceWorkflow`, on a
private task queue served by a temporary ``temporalio.worker.Worker`` in this
process; the outcomes come back raw and are judged here, in plain Python:

1. ``example[i]``: each spec example returns a valid ``WorkerResponse``
   envelope (``observability``, ``usage`` and all) for this worker, whose
   ``outputs`` are valid against ``output_schema``. Examples marked
   ``network``, and all examples of a worker with ``side_effects``, run only
   when asked (``--network``, ``--side-effects``); otherwise they are skipped
   with the reason.
2. ``invalid input``: an input derived to break ``input_schema`` (a missing
   required property, a wrong type, an undeclared property of a closed
   object) fails exactly once, non-retryable, as ``invalid_input``.
3. ``error info``: every failure carries an ``ErrorInfo`` in ``details[0]``
   whose ``code`` is a stable code equal to the failure's type.
4. ``tightened timeout``: a request with a lower ``constraints.timeout_seconds``
   gets a response whose ``observability.timeout_seconds`` is that value (the
   deadline reached the worker; an external worker must echo it).
5. ``wrong version``: a request for another contract major version is refused
   as ``invalid_input``, once.

Attempt counts come from the workflow's history (the ``ActivityTaskStarted``
event of each call), not from what the worker says about itself.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import ValidationError
from temporalio.client import Client

from aiworker.schemas.catalog import current_specs
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.protocol import (
    ErrorInfo,
    RequestConstraints,
    TraceContext,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.spec import SpecExample, WorkerSpec, describe_validation
from aiworker.workflows.conformance import ConformanceCall, ConformancePlan, ConformanceWorkflow

Status = Literal["pass", "fail", "skip"]
PASS: Status = "pass"
FAIL: Status = "fail"
SKIP: Status = "skip"

DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds one call may take, retries included, before it counts as unanswered."""

_INVALID_ID = "invalid-input"
_VERSION_ID = "wrong-version"
_TIMEOUT_ID = "tightened-timeout"


@dataclass(frozen=True)
class Check:
    """One named check and its verdict, with the reason in words."""

    name: str
    status: Status
    reason: str


@dataclass
class ConformanceReport:
    """What :func:`check_worker` found; ``passed`` unless a check failed."""

    worker_id: str
    version: str
    task_queue: str
    workflow_id: str | None = None
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed (skipped checks do not fail a report)."""
        return all(c.status != FAIL for c in self.checks)

    def failed(self) -> list[Check]:
        """The failed checks."""
        return [c for c in self.checks if c.status == FAIL]

    def check(self, name: str) -> Check:
        """The check called ``name``; ``KeyError`` names the checks there are."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (``aiworker conformance --json``)."""
        return {
            "worker_id": self.worker_id,
            "version": self.version,
            "task_queue": self.task_queue,
            "workflow_id": self.workflow_id,
            "passed": self.passed,
            "checks": [asdict(c) for c in self.checks],
        }

    def render(self) -> str:
        """The report for a terminal: one line per check, then the counts."""
        lines = [
            f"conformance of worker {self.worker_id} {self.version} "
            f"(task queue {self.task_queue}, workflow {self.workflow_id or '-'})"
        ]
        lines += [f"  {c.status.upper():<4}  {c.name}: {c.reason}" for c in self.checks]
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, SKIP)}
        verdict = "PASSED" if self.passed else "FAILED"
        lines.append(
            f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"
        )
        return "\n".join(lines)


def examples_for(spec: WorkerSpec, raw: Any, where: str) -> list[SpecExample]:
    """``raw`` (a JSON list like a spec's ``examples``) checked as examples of ``spec``.

    ``ValueError`` names ``where`` and the field (an input that breaks
    ``input_schema``, a prompt worker's example not marked ``network``).
    """
    try:
        checked = WorkerSpec.model_validate({**spec.model_dump(mode="json"), "examples": raw})
    except ValidationError as e:
        raise ValueError(f"{where}: {describe_validation(e)}") from None
    return checked.examples


def load_examples(spec: WorkerSpec, path: str | Path) -> list[SpecExample]:
    """Examples from a JSON file (a list like a spec's ``examples``) for ``spec``."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text("utf-8"))
    except OSError as e:
        raise ValueError(f"{p}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from None
    return examples_for(spec, raw, str(p))


_WRONG_TYPE: dict[str, Any] = {
    "string": 12345,
    "integer": "not an integer",
    "number": "not a number",
    "boolean": "not a boolean",
    "array": "not an array",
    "object": "not an object",
    "null": "not null",
}
_UNEXPECTED = "conformance_undeclared_property"


def invalid_inputs(spec: WorkerSpec) -> list[tuple[dict[str, Any], str]]:
    """Inputs that break ``input_schema``, each with what is wrong with it.

    Derived from the first example (or an empty object): without a required
    property, with a declared property of the wrong type, with an undeclared
    property where ``additionalProperties`` is false. Only inputs that the
    schema really refuses are returned; empty when none can be derived.
    """
    schema = spec.input_schema
    validator = Draft202012Validator(schema)
    base: dict[str, Any] = dict(spec.examples[0].input) if spec.examples else {}
    candidates: list[tuple[dict[str, Any], str]] = []
    required = [r for r in schema.get("required", []) if isinstance(r, str)]
    if required:
        missing = {k: v for k, v in base.items() if k != required[0]}
        candidates.append((missing, f"without its required property {required[0]!r}"))
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    # a property the base input holds first: then only its type is wrong
    for name in sorted(props, key=lambda n: (n not in base, n)):
        declared = props[name].get("type") if isinstance(props[name], dict) else None
        if isinstance(declared, str) and declared in _WRONG_TYPE:
            wrong = _WRONG_TYPE[declared]
            candidates.append(
                ({**base, name: wrong}, f"with property {name!r} of the wrong type ({wrong!r})")
            )
            break
    if schema.get("additionalProperties") is False and _UNEXPECTED not in props:
        candidates.append(
            ({**base, _UNEXPECTED: True}, f"with the undeclared property {_UNEXPECTED!r}")
        )
    return [(inp, why) for inp, why in candidates if not validator.is_valid(inp)]


def other_major(version: str) -> str:
    """A contract version whose major differs from ``version``'s."""
    major, _, rest = version.partition(".")
    other = str(int(major) + 1) if major.isdigit() else f"{major}x"
    return f"{other}.{rest}" if rest else other


def tightened_timeout(spec: WorkerSpec) -> float:
    """A timeout below the spec's, for the ``tightened timeout`` check."""
    t = spec.constraints.timeout_seconds
    return round(t * 0.75, 3) or t / 2


def _request(
    spec: WorkerSpec,
    run: str,
    call_id: str,
    input: dict[str, Any],
    *,
    tenant: str,
    version: str | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    trace = TraceContext(trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16])
    return WorkerRequest(
        worker_id=spec.worker_id,
        version=version or spec.version,
        idempotency_key=f"conformance/{run}/{call_id}",
        step_id=call_id,
        tenant=tenant,
        trace=trace,
        input=input,
        constraints=RequestConstraints(timeout_seconds=timeout_seconds),
    ).model_dump(mode="json", exclude_none=True)


async def check_worker(
    client: Client,
    spec: WorkerSpec | str,
    *,
    queue_suffix: str = "",
    network: bool = False,
    side_effects: bool = False,
    examples: list[SpecExample] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    tenant: str = "default",
) -> ConformanceReport:
    """Run the conformance checks against the live worker ``spec`` names.

    Some worker process must serve the worker on its spec's task queue (with
    ``queue_suffix``) on the server ``client`` talks to; this function serves
    only its own workflow, on a private queue, for the duration of the call.
    In a test::

        report = await check_worker(client, "word-count", queue_suffix=suffix)
        assert report.passed, report.render()

    Args:
        client: a client of the namespace the worker process polls in.
        spec: the worker's spec, or its id in this process's catalog.
        queue_suffix: the deployment's ``AIWORKER_TASK_QUEUE_SUFFIX``.
        network: also run examples marked ``network`` (they reach a site or a model).
        side_effects: also run the examples of a worker with ``side_effects``.
        examples: run these instead of the spec's ``examples`` (see :func:`examples_for`).
        call_timeout: seconds each call may take, retries included, before it counts
            as unanswered (nobody polls the queue, or the worker hangs).
        tenant: the tenant of every request.

    Returns:
        The report; ``report.passed`` unless a check failed.
    """
    from temporalio.worker import Worker as TemporalWorker

    from aiworker.workers.worker import workflow_runner

    if isinstance(spec, str):
        specs = current_specs()
        if spec not in specs:
            raise KeyError(f"unknown worker {spec!r}; known: {', '.join(sorted(specs))}")
        spec = specs[spec]
    if examples is not None:
        spec = spec.model_copy(update={"examples": examples})
    report = ConformanceReport(spec.worker_id, spec.version, spec.task_queue + queue_suffix)
    run = uuid.uuid4().hex[:12]
    calls, skipped = _plan(spec, run, tenant=tenant, network=network, side_effects=side_effects)
    plan = ConformancePlan(
        spec=spec.model_dump(mode="json"),
        queue_suffix=queue_suffix,
        call_timeout_seconds=call_timeout,
        calls=calls,
    )
    queue = f"aiworker-conformance-{run}"
    workflow_id = f"conformance-{spec.worker_id}-{run}"
    report.workflow_id = workflow_id
    async with TemporalWorker(
        client, task_queue=queue, workflows=[ConformanceWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            ConformanceWorkflow.run,
            plan.model_dump(mode="json"),
            id=workflow_id,
            task_queue=queue,
            # every call bounded by `call_timeout`; the margin covers the workflow tasks
            execution_timeout=timedelta(seconds=call_timeout * len(calls) + 60),
        )
        result = await handle.result()
        attempts = await _attempts(handle)
    outcomes = {o["id"]: {**o, "attempts": attempts.get(o["id"], 0)} for o in result["calls"]}
    report.checks = _judge(spec, calls, outcomes, skipped, report.task_queue, call_timeout)
    return report


def _plan(
    spec: WorkerSpec, run: str, *, tenant: str, network: bool, side_effects: bool
) -> tuple[list[ConformanceCall], dict[str, str]]:
    """The calls to make, and the examples skipped (by check name) with the reason."""
    calls: list[ConformanceCall] = []
    skipped: dict[str, str] = {}
    runnable: list[SpecExample] = []
    for i, ex in enumerate(spec.examples):
        name = _example_name(i, ex)
        if spec.side_effects and not side_effects:
            skipped[name] = "the worker has side_effects: run with --side-effects (or --all)"
        elif ex.network and not network:
            skipped[name] = "the example needs the network: run with --network (or --all)"
        else:
            runnable.append(ex)
            cid = f"example-{i}"
            calls.append(
                ConformanceCall(
                    id=cid, request=_request(spec, run, cid, dict(ex.input), tenant=tenant)
                )
            )
    if runnable:
        t = tightened_timeout(spec)
        calls.append(
            ConformanceCall(
                id=_TIMEOUT_ID,
                request=_request(
                    spec,
                    run,
                    _TIMEOUT_ID,
                    dict(runnable[0].input),
                    tenant=tenant,
                    timeout_seconds=t,
                ),
                timeout_seconds=t,
            )
        )
    bad = invalid_inputs(spec)
    if bad:
        calls.append(
            ConformanceCall(
                id=_INVALID_ID, request=_request(spec, run, _INVALID_ID, bad[0][0], tenant=tenant)
            )
        )
    base = dict(spec.examples[0].input) if spec.examples else {}
    calls.append(
        ConformanceCall(
            id=_VERSION_ID,
            request=_request(
                spec, run, _VERSION_ID, base, tenant=tenant, version=other_major(spec.version)
            ),
        )
    )
    return calls, skipped


def _example_name(i: int, ex: SpecExample) -> str:
    return f"example[{i}]" + (f" ({ex.description})" if ex.description else "")


async def _attempts(handle: Any) -> dict[str, int]:
    """How many attempts each call took, from the history (by activity id)."""
    scheduled: dict[int, str] = {}
    out: dict[str, int] = {}
    history = await handle.fetch_history()
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_id
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            if a.scheduled_event_id in scheduled:
                out[scheduled[a.scheduled_event_id]] = a.attempt
    return out


def _judge(
    spec: WorkerSpec,
    calls: list[ConformanceCall],
    outcomes: dict[str, dict[str, Any]],
    skipped: dict[str, str],
    queue: str,
    timeout: float,
) -> list[Check]:
    checks: list[Check] = []
    if not spec.examples:
        checks.append(Check("examples", SKIP, "the spec lists no examples"))
    for i, ex in enumerate(spec.examples):
        name = _example_name(i, ex)
        if name in skipped:
            checks.append(Check(name, SKIP, skipped[name]))
        else:
            checks.append(_example(spec, name, outcomes[f"example-{i}"], queue, timeout))

    t = tightened_timeout(spec)
    tname = "tightened timeout"
    if _TIMEOUT_ID in outcomes:
        checks.append(_timeout(spec, tname, outcomes[_TIMEOUT_ID], t, queue, timeout))
    else:
        checks.append(Check(tname, SKIP, "needs an example that runs, and none ran"))

    iname = "invalid input"
    if _INVALID_ID in outcomes:
        _, why = invalid_inputs(spec)[0]
        checks.append(
            _refused(spec, iname, f"an input {why}", outcomes[_INVALID_ID], queue, timeout)
        )
    else:
        checks.append(
            Check(iname, SKIP, "no input that breaks input_schema could be derived from it")
        )

    other = other_major(spec.version)
    checks.append(
        _refused(
            spec,
            "wrong version",
            f"a request for contract version {other!r}",
            outcomes[_VERSION_ID],
            queue,
            timeout,
        )
    )
    checks.append(_error_info([outcomes[c.id] for c in calls]))
    return checks


def _unanswered(o: dict[str, Any], queue: str, timeout: float) -> str | None:
    """Why a call got no answer from the worker at all, or None."""
    f = o.get("failure") or {}
    if o["ok"] or f.get("kind") == "application":
        return None
    if f.get("kind") == "timeout" and o["attempts"] == 0:
        return (
            f"no answer within {timeout:g}s: is a worker process polling task queue {queue}? "
            f"({f.get('message')})"
        )
    return f"the call failed without a worker error: {f.get('kind')} {f.get('type')}: " + str(
        f.get("message")
    )


def _describe_failure(o: dict[str, Any]) -> str:
    f = o["failure"]
    return f"failed with {f.get('type')} after {o['attempts']} attempt(s): {f.get('message')}"


def _envelope(spec: WorkerSpec, raw: Any) -> tuple[WorkerResponse | None, list[str]]:
    """The response as a ``WorkerResponse`` of this worker, or the problems with it."""
    try:
        resp = WorkerResponse.model_validate(raw)
    except ValidationError as e:
        return None, [f"the response is not a valid envelope: {describe_validation(e)}"]
    problems = []
    if resp.worker_id != spec.worker_id:
        problems.append(f"worker_id is {resp.worker_id!r}, not {spec.worker_id!r}")
    if resp.observability.worker_id != spec.worker_id:
        problems.append(
            f"observability.worker_id is {resp.observability.worker_id!r}, not {spec.worker_id!r}"
        )
    if resp.version.split(".")[0] != spec.version.split(".")[0]:
        problems.append(f"version {resp.version!r} is not of the spec's major ({spec.version!r})")
    return resp, problems


def _example(spec: WorkerSpec, name: str, o: dict[str, Any], queue: str, timeout: float) -> Check:
    why = _unanswered(o, queue, timeout)
    if why:
        return Check(name, FAIL, why)
    if not o["ok"]:
        return Check(name, FAIL, _describe_failure(o))
    resp, problems = _envelope(spec, o["response"])
    if resp is None:
        return Check(name, FAIL, "; ".join(problems))
    errors = sorted(
        Draft202012Validator(spec.output_schema).iter_errors(resp.outputs),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    for err in errors[:3]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        problems.append(f"outputs{path}: {err.message} (output_schema rule {err.validator})")
    if problems:
        return Check(name, FAIL, "; ".join(problems))
    return Check(
        name,
        PASS,
        f"{resp.status} in {o['attempts']} attempt(s); envelope valid, outputs valid against "
        "output_schema",
    )


def _timeout(
    spec: WorkerSpec, name: str, o: dict[str, Any], t: float, queue: str, timeout: float
) -> Check:
    why = _unanswered(o, queue, timeout)
    if why:
        return Check(name, FAIL, why)
    if not o["ok"]:
        return Check(name, FAIL, f"with timeout_seconds={t:g}: {_describe_failure(o)}")
    resp, problems = _envelope(spec, o["response"])
    if resp is None:
        return Check(name, FAIL, "; ".join(problems))
    got = resp.observability.timeout_seconds
    if got is None:
        return Check(
            name,
            FAIL,
            f"sent constraints.timeout_seconds={t:g}, but the response's "
            "observability.timeout_seconds is missing (the worker must report the deadline "
            "it ran under)",
        )
    if got != t:
        return Check(
            name,
            FAIL,
            f"sent constraints.timeout_seconds={t:g} (spec {spec.constraints.timeout_seconds:g}), "
            f"but the worker ran under observability.timeout_seconds={got:g}",
        )
    return Check(
        name,
        PASS,
        f"timeout_seconds={t:g} (spec {spec.constraints.timeout_seconds:g}) reached the worker",
    )


def _refused(
    spec: WorkerSpec, name: str, what: str, o: dict[str, Any], queue: str, timeout: float
) -> Check:
    """``what`` must fail once, non-retryable, as ``invalid_input``."""
    why = _unanswered(o, queue, timeout)
    if why:
        return Check(name, FAIL, why)
    if o["ok"]:
        return Check(name, FAIL, f"the worker accepted {what}")
    f = o["failure"]
    problems = []
    if f.get("type") != ErrorCode.INVALID_INPUT.value:
        problems.append(f"failed as {f.get('type')!r}, not 'invalid_input'")
    if not f.get("non_retryable"):
        problems.append("the failure is not marked non_retryable")
    if o["attempts"] != 1:
        problems.append(
            f"took {o['attempts']} attempts, not 1 (the spec allows {spec.retries.max_attempts})"
        )
    if problems:
        return Check(name, FAIL, f"{what}: " + "; ".join(problems) + f" ({f.get('message')})")
    return Check(
        name,
        PASS,
        f"{what} failed once (the spec allows {spec.retries.max_attempts} attempts), "
        f"non-retryable invalid_input: {f.get('message')}",
    )


def _error_info(outcomes: list[dict[str, Any]]) -> Check:
    """Every worker failure carries an ``ErrorInfo`` whose code is its type."""
    name = "error info"
    failures = [o for o in outcomes if not o["ok"] and o["failure"].get("kind") == "application"]
    if not failures:
        return Check(name, SKIP, "no call failed, so there was no failure to look at")
    problems = []
    for o in failures:
        f = o["failure"]
        ftype = f.get("type")
        if ftype not in {c.value for c in ErrorCode}:
            problems.append(f"{o['id']}: type {ftype!r} is not a stable error code")
        details = f.get("details") or []
        if not details or not isinstance(details[0], dict):
            problems.append(f"{o['id']}: {ftype} carries no ErrorInfo in details[0]")
            continue
        try:
            info = ErrorInfo.model_validate(details[0])
        except ValidationError as e:
            problems.append(f"{o['id']}: details[0] is not an ErrorInfo: {describe_validation(e)}")
            continue
        if info.code.value != ftype:
            problems.append(f"{o['id']}: ErrorInfo.code {info.code.value!r} != type {ftype!r}")
        if info.retryable == bool(f.get("non_retryable")):
            problems.append(
                f"{o['id']}: ErrorInfo.retryable={info.retryable} contradicts "
                f"non_retryable={f.get('non_retryable')}"
            )
    if problems:
        return Check(name, FAIL, "; ".join(problems))
    return Check(
        name,
        PASS,
        f"{len(failures)} failure(s), each with an ErrorInfo whose code is its type "
        f"({', '.join(sorted({o['failure']['type'] for o in failures}))})",
    )
