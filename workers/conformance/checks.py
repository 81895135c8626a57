"""The checks of the conformance kit: each call's raw outcome judged against the spec.

Plain Python, no Temporal: :mod:`aiworker.workers.conformance.run` makes the calls
(through ``ConformanceWorkflow``) and hands the outcomes here; the derived
inputs (an input that breaks ``input_schema``, another contract version, a
tightened timeout) are built here too, so the plan and its judgement agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from aiworker.schemas import safe_schema
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.messages import reasons
from aiworker.schemas.protocol import (
    ErrorInfo,
    WorkerResponse,
)
from aiworker.schemas.spec import SpecExample, WorkerSpec, describe_validation
from aiworker.workflows.conformance import ConformanceCall

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


_UNEXPECTED = "conformance_undeclared_property"


_WRONG_TYPE: dict[str, Any] = {
    "string": 12345,
    "integer": "not an integer",
    "number": "not a number",
    "boolean": "not a boolean",
    "array": "not an array",
    "object": "not an object",
    "null": "not null",
}


def _example_name(i: int, ex: SpecExample) -> str:
    return f"example[{i}]" + (f" ({ex.description})" if ex.description else "")


def invalid_inputs(spec: WorkerSpec) -> list[tuple[dict[str, Any], str]]:
    """Inputs that break ``input_schema``, each with what is wrong with it.

    Derived from the first example (or an empty object): without a required
    property, with a declared property of the wrong type, with an undeclared
    property where ``additionalProperties`` is false. Only inputs that the
    schema really refuses are returned; empty when none can be derived.
    """
    schema = spec.input_schema
    validator = safe_schema.validator(schema)
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
    return [(inp, why) for inp, why in candidates if safe_schema.errors(validator, inp)]


def other_major(version: str) -> str:
    """A contract version whose major differs from ``version``'s."""
    major, _, rest = version.partition(".")
    # ASCII digits only: str.isdigit is true of "²", which int() refuses
    other = str(int(major) + 1) if major.isascii() and major.isdigit() else f"{major}x"
    return f"{other}.{rest}" if rest else other


def tightened_timeout(spec: WorkerSpec) -> float:
    """A timeout below the spec's, for the ``tightened timeout`` check."""
    t = spec.constraints.timeout_seconds
    return round(t * 0.75, 3) or t / 2


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
    if f.get("kind") == "undecodable":  # the workflow could not decode the reply
        return f"the worker answered, but {f.get('message')}"
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
    try:
        found = safe_schema.errors(safe_schema.validator(spec.output_schema), resp.outputs)
    except safe_schema.SchemaError as e:
        return Check(name, FAIL, f"outputs: {safe_schema.problem(e)}")
    for r in reasons(found, limit=3):
        problems.append(
            f"outputs{r['path'][1:]}: {r['message']} (output_schema rule {r['validator']})"
        )
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
