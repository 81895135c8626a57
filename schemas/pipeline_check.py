"""Check a pipeline spec as a whole before anything runs.

:func:`parse_pipeline` validates the fields and then :func:`check_pipeline`
checks the spec as a whole (unknown worker, duplicate id, cycle, dangling or
forward reference, bad JSON Schema); every problem is a message naming the
step and field. ``when`` and ``validate`` schemas are checked as
:mod:`~aiworker.schemas.safe_schema` applies them (a pattern RE2 refuses, a
remote ``$ref``: invalid); a validator or llm-call step's literal
``input.schema``/``input.response_schema`` is checked for remote references
(the worker checks the rest when it runs): no schema is ever fetched.
:func:`cap_problems` goes first (steps, ``for_each`` items, nesting, reference
strings and counts, :mod:`~aiworker.schemas.caps`): against the hard ceilings
at workflow start, against the settings' caps on the client side and, in the
workflow, once the plan brought them. The pipeline workflow
turns a :class:`PipelineSpecError` into a non-retryable ``invalid_input``;
``aiworker run`` and the client check a file the same way without importing
any workflow code.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from aiworker.schemas import names, safe_schema
from aiworker.schemas.caps import SETTING_OF, Caps
from aiworker.schemas.pipeline import Concurrency, PipelineSpec, Step
from aiworker.schemas.refs import ReferenceError_, ReferenceLimitError, find_refs, json_depth


class PipelineSpecError(ValueError):
    """A pipeline spec that cannot run; ``problems`` lists each one, naming step and field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid pipeline: " + "; ".join(problems))
        self.problems = problems


def parse_pipeline(raw: Any, known_workers: set[str], caps: Caps | None = None) -> PipelineSpec:
    """Parse and check a pipeline spec.

    Args:
        raw: the spec as decoded JSON.
        known_workers: the worker ids that steps may name.
        caps: the caps to check against; the hard ceilings when omitted (the
            check at workflow start, which cannot read settings).

    Returns:
        The parsed spec.

    Raises:
        PipelineSpecError: naming every problem found.
    """
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as e:
        raise PipelineSpecError(_field_problems(raw, e)) from None
    problems = check_pipeline(spec, known_workers, caps)
    if problems:
        raise PipelineSpecError(problems)
    return spec


def _field_problems(raw: Any, e: ValidationError) -> list[str]:
    problems = []
    for err in e.errors():
        loc = list(err["loc"])
        where = "pipeline"
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            steps = raw.get("steps") if isinstance(raw, dict) else None
            sid = None
            if isinstance(steps, list) and loc[1] < len(steps) and isinstance(steps[loc[1]], dict):
                sid = steps[loc[1]].get("id")
            where = f"step {sid!r}" if sid else f"step #{loc[1]}"
            loc = loc[2:]
        field = ".".join(str(p) for p in loc) or "(root)"
        problems.append(f"{where}: field {field!r}: {err['msg']}")
    return problems


# The input field in which a built-in worker takes a JSON Schema to apply.
SCHEMA_INPUTS = {names.VALIDATOR: "schema", names.LLM_CALL: "response_schema"}


def _schema_problem(schema: Any) -> str | None:
    try:
        safe_schema.check(schema)
    except SchemaError as e:
        return safe_schema.problem(e)
    return None


def _input_schema_problems(step: Step, where: str) -> list[str]:
    """Remote references in a literal schema of the step's input (or fallback
    input); one that holds a reference expression is the worker's to check."""
    problems = []
    for field, worker, value in (
        ("input", step.worker, step.input),
        ("fallback_input", step.fallback, step.fallback_input),
    ):
        key = SCHEMA_INPUTS.get(worker or "")
        if key is None or not isinstance(value, dict) or key not in value:
            continue
        try:
            if find_refs(value[key]):
                continue
        except ReferenceError_:
            continue  # reported on the field by check_pipeline
        try:
            safe_schema.check_references(value[key])
        except SchemaError as e:
            problems.append(f"{where}: field '{field}.{key}': {safe_schema.problem(e)}")
    return problems


# Fields that are never resolved: only their nesting is capped.
_DEPTH_ONLY = ("inputs", "validate.schema")


def _fields(step: Step) -> list[tuple[str, Any]]:
    """A step's fields that hold user JSON, by name."""
    fields: list[tuple[str, Any]] = [("input", step.input)]
    if step.fallback_input is not None:
        fields.append(("fallback_input", step.fallback_input))
    if step.when is not None:
        fields.append(("when", step.when))
    if step.for_each is not None:
        fields.append(("for_each", step.for_each))
    if step.validate_ is not None:
        fields.append(("validate.schema", step.validate_.schema_))
    if step.concurrency is not None:
        fields.append(("concurrency.key", step.concurrency.key))
    return fields


def _over(caps: Caps, name: str) -> str:
    return f"the cap is {getattr(caps, name)} ({SETTING_OF[name]})"


def cap_problems(spec: PipelineSpec, caps: Caps) -> list[str]:
    """What of ``spec`` passes ``caps``: steps, ``for_each`` items, nesting, the
    length of reference strings and the count of references; each problem names
    the step and field. Walks without recursion, before anything else walks."""
    problems: list[str] = []
    if len(spec.steps) > caps.max_steps:
        problems.append(
            f"pipeline: field 'steps': {len(spec.steps)} steps; {_over(caps, 'max_steps')}"
        )
    where_fields: list[tuple[str, str, Any]] = [("pipeline", "inputs", spec.inputs)]
    where_fields += [("pipeline", "output", spec.output)]
    if spec.concurrency is not None:
        where_fields.append(("pipeline", "concurrency.key", spec.concurrency.key))
    for step in spec.steps:
        where_fields += [(f"step {step.id!r}", f, v) for f, v in _fields(step)]
        if isinstance(step.for_each, list) and len(step.for_each) > caps.max_foreach_items:
            problems.append(
                f"step {step.id!r}: field 'for_each': {len(step.for_each)} items; "
                f"{_over(caps, 'max_foreach_items')}"
            )
    count = 0
    for where, field, value in where_fields:
        try:
            if field in _DEPTH_ONLY:
                json_depth(value, caps.max_json_depth)
            else:
                count += len(find_refs(value, caps=caps))
        except ReferenceLimitError as e:
            problems.append(f"{where}: field {field!r}: {e}")
        except ReferenceError_:
            pass  # a malformed reference: the check proper names it
    if count > caps.max_references:
        problems.append(
            f"pipeline: {count} references in the pipeline; {_over(caps, 'max_references')}"
        )
    return problems


def check_pipeline(
    spec: PipelineSpec, known_workers: set[str], caps: Caps | None = None
) -> list[str]:
    """Every problem of a pipeline, each naming the step and field; empty when fine.

    ``caps`` first (the hard ceilings when omitted): a spec over a cap is not
    walked any further.
    """
    problems = cap_problems(spec, caps or Caps.ceilings())
    if problems:
        return problems
    ids = [s.id for s in spec.steps]
    index = {s.id: i for i, s in enumerate(spec.steps)}
    seen: set[str] = set()
    for sid in ids:
        if sid in seen:
            problems.append(f"step {sid!r}: duplicate id")
        seen.add(sid)

    deps: dict[str, set[str]] = {}
    for step in spec.steps:
        where = f"step {step.id!r}"
        if step.worker not in known_workers:
            problems.append(
                f"{where}: field 'worker': unknown worker {step.worker!r} "
                f"(known: {', '.join(sorted(known_workers))})"
            )
        if step.fallback is not None and step.fallback not in known_workers:
            problems.append(f"{where}: field 'fallback': unknown worker {step.fallback!r}")
        d = set(step.depends_on)
        for dep in step.depends_on:
            if dep not in index:
                problems.append(f"{where}: field 'depends_on': unknown step {dep!r}")
            elif dep == step.id:
                problems.append(f"{where}: field 'depends_on': a step cannot depend on itself")
        if step.gate is not None:
            if step.gate not in index:
                problems.append(f"{where}: field 'gate': unknown step {step.gate!r}")
            else:
                gate_worker = spec.steps[index[step.gate]].worker
                if gate_worker != "validator":
                    problems.append(
                        f"{where}: field 'gate': step {step.gate!r} is a {gate_worker!r} step, "
                        "a gate must be a validator step"
                    )
                d.add(step.gate)
        fields = [(f, v) for f, v in _fields(step) if f not in _DEPTH_ONLY]
        if isinstance(step.for_each, list):
            fields = [(f, v) for f, v in fields if f != "for_each"]
        if step.when is not None:
            if set(step.when) != {"value", "schema"}:
                problems.append(f"{where}: field 'when': needs exactly 'value' and 'schema'")
            elif (p := _schema_problem(step.when["schema"])) is not None:
                problems.append(f"{where}: field 'when.schema': {p}")
        if step.validate_ is not None and (p := _schema_problem(step.validate_.schema_)):
            problems.append(f"{where}: field 'validate.schema': {p}")
        problems.extend(_input_schema_problems(step, where))
        if step.for_each is not None and step.on_failure == "escalate":
            problems.append(
                f"{where}: field 'on_failure': 'escalate' needs a single step, not a for_each"
            )
        if step.for_each is not None and step.validate_ is not None:
            problems.append(
                f"{where}: field 'validate': the validation loop needs a single step, "
                "not a for_each (validate the items in a later step)"
            )
        if step.fallback_input is not None and step.fallback is None:
            problems.append(f"{where}: field 'fallback_input': set without 'fallback'")
        for field, value in fields:
            try:
                refs = find_refs(value)
            except ReferenceError_ as e:
                problems.append(f"{where}: field {field!r}: {e}")
                continue
            for ref in refs:
                if ref.root in ("item", "item_index") and step.for_each is None:
                    problems.append(
                        f"{where}: field {field!r}: {ref.text} is only available in for_each"
                    )
                if ref.root in ("item", "item_index") and field == "for_each":
                    problems.append(f"{where}: field 'for_each': cannot refer to item")
                target = ref.step_id
                if target is None:
                    continue
                if target not in index:
                    problems.append(
                        f"{where}: field {field!r}: reference {ref.text} names unknown step "
                        f"{target!r}"
                    )
                elif target == step.id:
                    problems.append(f"{where}: field {field!r}: reference {ref.text} is to itself")
                else:
                    d.add(target)
        deps[step.id] = d
    if step_refs_problems := _output_problems(spec, index):
        problems.extend(step_refs_problems)
    if spec.concurrency is not None:
        problems.extend(_pipeline_concurrency_problems(spec.concurrency))
    if not problems:
        cycle = _find_cycle(deps)
        if cycle:
            problems.append(f"step {cycle[0]!r}: field 'depends_on': cycle {' -> '.join(cycle)}")
    return problems


def _output_problems(spec: PipelineSpec, index: dict[str, int]) -> list[str]:
    problems: list[str] = []
    try:
        refs = find_refs(spec.output)
    except ReferenceError_ as e:
        return [f"pipeline: field 'output': {e}"]
    for ref in refs:
        if ref.root in ("item", "item_index"):
            problems.append(f"pipeline: field 'output': {ref.text} is only available in for_each")
        elif ref.step_id is not None and ref.step_id not in index:
            problems.append(
                f"pipeline: field 'output': reference {ref.text} names unknown step {ref.step_id!r}"
            )
    return problems


def _pipeline_concurrency_problems(c: Concurrency) -> list[str]:
    """A pipeline's key is known before any step runs: it may refer to inputs only."""
    try:
        refs = find_refs(c.key)
    except ReferenceError_ as e:
        return [f"pipeline: field 'concurrency.key': {e}"]
    return [
        f"pipeline: field 'concurrency.key': {ref.text} is not available before the steps run "
        "(use inputs)"
        for ref in refs
        if ref.root != "inputs"
    ]


def _find_cycle(deps: dict[str, set[str]]) -> list[str] | None:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        stack.append(n)
        for m in sorted(deps.get(n, ())):
            if color.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if color.get(m, 0) == 0 and (found := visit(m)):
                return found
        stack.pop()
        color[n] = 2
        return None

    for n in deps:
        if color.get(n, 0) == 0 and (found := visit(n)):
            return found
    return None
