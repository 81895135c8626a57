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
workflow, once the run config brought them. The pipeline workflow
turns a :class:`PipelineSpecError` into a non-retryable ``invalid_input``;
``aiworker run`` and the client check a file the same way without importing
any workflow code.

Given the workers' specs (not only their ids), :mod:`~aiworker.schemas.step_inputs`
checks every step's literal input against its worker's contract too (schema,
references to inputs and outputs, selectors, regexes, literal JSON Schemas).
Each problem is a :class:`~aiworker.schemas.problems.Problem` (step, field,
JSON path, message, suggestion); ``PipelineSpecError.problems`` holds their
one-line forms. The part that needs process settings (model aliases, tenants)
is ``aiworker.workers.process.pipeline_settings``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from fractions import Fraction
from typing import Any

from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from aiworker.schemas import names, safe_schema
from aiworker.schemas.agent import allow_list
from aiworker.schemas.callbacks import MAX_WAIT_ITEMS, TOKEN_FIELDS
from aiworker.schemas.caps import SETTING_OF, Caps
from aiworker.schemas.compile_caps import compile_cap_problems
from aiworker.schemas.messages import suggest
from aiworker.schemas.pipeline import Concurrency, PipelineSpec, Step
from aiworker.schemas.problems import Problem, field_problems
from aiworker.schemas.refs import ReferenceError_, ReferenceLimitError, find_refs, json_depth
from aiworker.schemas.spec import WorkerSpec
from aiworker.schemas.step_inputs import DEPTH_ONLY, SCHEMA_INPUTS, step_fields, step_problems

# The workers a pipeline may name: their ids, or their specs by id (None: a
# worker known by name only, served elsewhere); with specs, inputs are checked too.
Workers = Collection[str] | Mapping[str, WorkerSpec | None]


class PipelineSpecError(ValueError):
    """A pipeline spec that cannot run.

    Attributes:
        problems: each problem as one line, naming step and field.
        details: the same as :class:`~aiworker.schemas.problems.Problem` values.
    """

    def __init__(self, problems: list[Problem] | list[str]) -> None:
        self.details = [p if isinstance(p, Problem) else Problem(None, "", p) for p in problems]
        self.problems = [str(p) for p in self.details]
        super().__init__("invalid pipeline: " + "; ".join(self.problems))


def parse_pipeline(
    raw: Any,
    known_workers: Workers,
    caps: Caps | None = None,
) -> PipelineSpec:
    """Parse and check a pipeline spec.

    Args:
        raw: the spec as decoded JSON.
        known_workers: the workers that steps may name: their ids, or their
            specs by id, with which each step's input is checked against its
            worker's contract as well.
        caps: the caps to check against; the hard ceilings when omitted.

    Returns:
        The parsed spec.

    Raises:
        PipelineSpecError: naming every problem found.
    """
    spec = parse_model(raw)
    problems = check_pipeline(
        spec,
        known_workers,
        caps,
    )
    if problems:
        raise PipelineSpecError(problems)
    return spec


def parse_model(raw: Any) -> PipelineSpec:
    """The pipeline model of ``raw``, nothing checked as a whole; its field errors
    as :class:`PipelineSpecError`. The pipeline workflow parses this much (and the
    hard ceilings) and leaves the rest to its run-config local activity."""
    try:
        return PipelineSpec.model_validate(raw)
    except ValidationError as e:
        raise PipelineSpecError(field_problems(raw, e)) from None


def _schema_problems(schema: Any) -> list[str]:
    """Every problem of a literal schema (:func:`~aiworker.schemas.safe_schema.problems`)."""
    return safe_schema.problems(schema)


def _input_schema_problems(step: Step, i: int) -> list[Problem]:
    """Remote references in a literal schema of the step's input (or fallback
    input), when the workers' specs are not at hand (with them,
    :mod:`~aiworker.schemas.step_inputs` checks the schema in full); one that
    holds a reference expression is the worker's to check."""
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
            problems.append(Problem(step.id, f"{field}.{key}", safe_schema.problem(e), index=i))
    return problems


TOLERATED_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")
"""A ``tolerated_failures`` share: digits, optional decimals, then ``%``."""


def tolerated_failures_problems(
    value: object, for_each: object, items_per_task: int = 1
) -> list[str]:
    """What is wrong with a step's ``tolerated_failures`` (issue #34, deliverable 2).

    A count (an int >= 0, not a bool) or a share ``"N%"`` with 0 <= N <= 100
    (decimals allowed), only on a for_each step whose items go one to an activity
    task (the threshold cannot stop part of a task's items: ``items_per_task`` 1).
    """
    if for_each is None:
        return ["only a for_each step takes tolerated_failures"]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return [f'must be an integer >= 0 or a string "N%", got {value!r}']
    if isinstance(value, int):
        if value < 0:
            return [f"must be >= 0, got {value}"]
    else:
        m = TOLERATED_PERCENT.match(value)
        if m is None:
            return [f'must be an integer >= 0 or a string "N%" (0-100), got {value!r}']
        if float(m.group(1)) > 100:
            return [f"a share cannot exceed 100%, got {value!r}"]
    if items_per_task > 1:
        return [
            "is not supported with items_per_task > 1 (a task's items cannot be stopped "
            "one by one): drop one of them"
        ]
    return []


def tolerated_count(value: int | str, total: int) -> int:
    """The failed items a step with ``tolerated_failures`` = ``value`` and
    ``total`` items tolerates: the count, or the share of ``total`` rounded down
    (``floor(total * N / 100)``, exact: ``"12.5%"`` of 20 items is 2). ``value``
    passed :func:`tolerated_failures_problems`."""
    if isinstance(value, int):
        return value
    m = TOLERATED_PERCENT.match(value)
    share = Fraction(m.group(1)) if m is not None else Fraction(0)
    return math.floor(share * total / 100)


def _items_per_task_problems(
    step: Step, i: int, specs: Mapping[str, WorkerSpec | None] | None
) -> list[Problem]:
    """``items_per_task`` above 1: only on a for_each, and only for a worker that
    aiworker's own runtime runs in a Python process (python or prompt)."""
    if step.for_each is None:
        return [
            Problem(step.id, "items_per_task", "only a for_each step takes items_per_task", index=i)
        ]
    worker = specs.get(step.worker) if specs is not None else None
    if worker is None or worker.kind in ("python", "prompt"):
        return []
    return [
        Problem(
            step.id,
            "items_per_task",
            f"worker {step.worker!r} is a {worker.kind} worker: items_per_task needs a python "
            "or prompt worker, which aiworker's runtime runs in its own process (drop "
            "items_per_task or set it to 1)",
            index=i,
        )
    ]


# Fields that are never resolved: only their nesting is capped.
def _over(caps: Caps, name: str) -> str:
    return f"the cap is {getattr(caps, name)} ({SETTING_OF[name]})"


def cap_problems(spec: PipelineSpec, caps: Caps) -> list[Problem]:
    """What of ``spec`` passes ``caps``: steps, ``for_each`` items, nesting, the
    length of reference strings and the count of references; each problem names
    the step and field. Walks without recursion, before anything else walks."""
    problems: list[Problem] = []
    if len(spec.steps) > caps.max_steps:
        problems.append(
            Problem(None, "steps", f"{len(spec.steps)} steps; {_over(caps, 'max_steps')}")
        )
    where_fields: list[tuple[str | None, int | None, str, Any]] = [
        (None, None, "inputs", spec.inputs),
        (None, None, "output", spec.output),
    ]
    if spec.concurrency is not None:
        where_fields.append((None, None, "concurrency.key", spec.concurrency.key))
    if spec.flow is not None:
        where_fields.append((None, None, "flow.key", spec.flow.key))
    for i, step in enumerate(spec.steps):
        where_fields += [(step.id, i, f, v) for f, v in step_fields(step)]
        if isinstance(step.for_each, list) and len(step.for_each) > caps.max_foreach_items:
            problems.append(
                Problem(
                    step.id,
                    "for_each",
                    f"{len(step.for_each)} items; {_over(caps, 'max_foreach_items')}",
                    index=i,
                )
            )
    count = 0
    for sid, at, field, value in where_fields:
        try:
            if field in DEPTH_ONLY:
                json_depth(value, caps.max_json_depth)
            else:
                count += len(find_refs(value, caps=caps))
        except ReferenceLimitError as e:
            problems.append(Problem(sid, field, str(e), index=at))
        except ReferenceError_:
            pass  # a malformed reference: the check proper names it
    if count > caps.max_references:
        problems.append(
            Problem(
                None, "", f"{count} references in the pipeline; {_over(caps, 'max_references')}"
            )
        )
    return problems


def _names(known_workers: Workers) -> tuple[set[str], Mapping[str, WorkerSpec | None] | None]:
    if isinstance(known_workers, Mapping):
        return set(known_workers), known_workers
    return set(known_workers), None


def check_pipeline(
    spec: PipelineSpec,
    known_workers: Workers,
    caps: Caps | None = None,
) -> list[Problem]:
    """Every problem of a pipeline, each naming the step and field; empty when fine.

    ``caps`` first (the hard ceilings when omitted): a spec over a cap is not
    walked any further. With the workers' specs (a mapping), each step's input
    is checked against its worker's contract
    (:func:`~aiworker.schemas.step_inputs.step_problems`).

    Then the caps on schemas and patterns, counted before anything compiles
    (:func:`~aiworker.schemas.compile_caps.compile_cap_problems`). A run makes
    this check once, in its ``run-config`` local activity, so that what compiles
    never holds a workflow task.
    """
    problems = cap_problems(spec, caps or Caps.ceilings())
    if not problems:
        problems = compile_cap_problems(spec)
    if problems:
        return problems
    known, specs = _names(known_workers)
    index = {s.id: i for i, s in enumerate(spec.steps)}
    seen: set[str] = set()
    for i, step in enumerate(spec.steps):
        if step.id in seen:
            problems.append(Problem(step.id, "", "duplicate id", index=i))
        seen.add(step.id)

    deps: dict[str, set[str]] = {}
    for i, step in enumerate(spec.steps):

        def add(at: str, message: str, suggestion: str | None = None) -> None:
            problems.append(Problem(step.id, at, message, suggestion, i))  # noqa: B023

        if step.wait is not None:
            problems.extend(_wait_problems(step, i))
        elif not step.worker:
            add("worker", "required: the worker_id to call (or a 'wait' instead)")
        elif step.worker not in known:
            add(
                "worker",
                f"unknown worker {step.worker!r} (known: {', '.join(sorted(known))})",
                suggest(step.worker, known),
            )
        if step.fallback is not None and step.fallback not in known:
            add("fallback", f"unknown worker {step.fallback!r}", suggest(step.fallback, known))
        d = set(step.depends_on)
        for dep in step.depends_on:
            if dep not in index:
                add("depends_on", f"unknown step {dep!r}", suggest(dep, index))
            elif dep == step.id:
                add("depends_on", "a step cannot depend on itself")
        if step.gate is not None:
            if step.gate not in index:
                add("gate", f"unknown step {step.gate!r}", suggest(step.gate, index))
            else:
                gate_worker = spec.steps[index[step.gate]].worker
                if gate_worker != "validator":
                    add(
                        "gate",
                        f"step {step.gate!r} is a {gate_worker!r} step, "
                        "a gate must be a validator step",
                    )
                d.add(step.gate)
        fields = [(f, v) for f, v in step_fields(step) if f not in DEPTH_ONLY]
        if isinstance(step.for_each, list):
            fields = [(f, v) for f, v in fields if f != "for_each"]
        if step.when is not None:
            if set(step.when) != {"value", "schema"}:
                add("when", "needs exactly 'value' and 'schema'")
            else:
                for p in _schema_problems(step.when["schema"]):
                    add("when.schema", p)
        if step.validate_ is not None:
            for p in _schema_problems(step.validate_.schema_):
                add("validate.schema", p)
        if specs is None:
            problems.extend(_input_schema_problems(step, i))
        if step.for_each is not None and step.on_failure == "escalate":
            add("on_failure", "'escalate' needs a single step, not a for_each")
        if step.for_each is not None and step.validate_ is not None:
            add(
                "validate",
                "the validation loop needs a single step, "
                "not a for_each (validate the items in a later step)",
            )
        if step.for_each is not None and step.worker == names.LLM_AGENT:
            add(
                "for_each",
                "an llm-agent step runs as a child workflow of its own and takes no for_each "
                "(give the items to the agent in its prompt, or use llm-call)",
            )
        if step.items_per_task > 1:
            problems.extend(_items_per_task_problems(step, i, specs))
        if step.tolerated_failures is not None:
            for message in tolerated_failures_problems(
                step.tolerated_failures, step.for_each, step.items_per_task
            ):
                add("tolerated_failures", message)
        if step.worker == names.LLM_AGENT and specs is not None:
            tools = step.input.get("tools") if isinstance(step.input, dict) else None
            known_specs = {k: v for k, v in specs.items() if v is not None}
            for t_i, tool in enumerate(tools if isinstance(tools, list) else []):
                # a reference is resolved at run time, where the agent checks it
                if isinstance(tool, (str, dict)) and "${{" not in json.dumps(tool):
                    for _, message in allow_list([tool], known_specs)[1]:
                        add(f"input.tools[{t_i}]", message)
        if step.fallback_input is not None and step.fallback is None:
            add("fallback_input", "set without 'fallback'")
        for field, value in fields:
            try:
                refs = find_refs(value)
            except ReferenceError_ as e:
                add(field, str(e))
                continue
            for ref in refs:
                if ref.root in ("item", "item_index") and step.for_each is None:
                    add(field, f"{ref.text} is only available in for_each")
                if ref.root in ("item", "item_index") and field == "for_each":
                    add("for_each", "cannot refer to item")
                target = ref.step_id
                if target is None:
                    continue
                if (
                    len(ref.path) > 1
                    and ref.path[1] in TOKEN_FIELDS
                    and target in index
                    and spec.steps[index[target]].wait is None
                ):
                    add(field, f"reference {ref.text}: step {target!r} is not a wait step")
                if target not in index:
                    add(
                        field,
                        f"reference {ref.text} names unknown step {target!r}",
                        suggest(target, index),
                    )
                elif target == step.id:
                    add(field, f"reference {ref.text} is to itself")
                else:
                    d.add(target)
        deps[step.id] = d
    problems.extend(_output_problems(spec, index))
    if spec.concurrency is not None:
        problems.extend(_pipeline_concurrency_problems(spec.concurrency))
    if spec.flow is not None:
        problems.extend(Problem(None, "flow.key", m) for m in spec.flow.key_problems())
    if not problems:
        cycle = _find_cycle(deps)
        if cycle:
            problems.append(
                Problem(
                    cycle[0], "depends_on", "cycle " + " -> ".join(cycle), index=index[cycle[0]]
                )
            )
    if specs is not None:
        # beside the problems above, so that one check names them all (each step's
        # checks stand on their own: an unknown worker or step is passed over there)
        found = step_problems(spec, specs)
        problems.extend(p for p in found if p not in problems)
    return problems


# What a wait step takes besides ``wait``: the fields that decide whether and
# how often it waits. Everything about calling a worker is refused by name.
_WAIT_FIELDS = frozenset(
    {
        "id",
        "wait",
        "depends_on",
        "when",
        "for_each",
        "max_parallel",
        "on_failure",
        "review_timeout_seconds",
    }
)


def _wait_problems(step: Step, i: int) -> list[Problem]:
    """A wait step: no worker or anything about calling one; a usable schema; at most
    :data:`MAX_WAIT_ITEMS` literal items."""
    if step.wait is None:
        return []
    problems = [
        Problem(step.id, f, "a wait step calls no worker: drop it", index=i)
        for f in sorted(step.model_fields_set - _WAIT_FIELDS)
        if f not in ("validate_",)
    ]
    if step.validate_ is not None:
        problems.append(
            Problem(
                step.id, "validate", "a wait step's outputs are checked by wait.schema", index=i
            )
        )
    if isinstance(step.for_each, list) and len(step.for_each) > MAX_WAIT_ITEMS:
        problems.append(
            Problem(
                step.id,
                "for_each",
                f"{len(step.for_each)} items; a wait step waits for at most {MAX_WAIT_ITEMS}",
                index=i,
            )
        )
    for p in _schema_problems(step.wait.schema_):
        problems.append(Problem(step.id, "wait.schema", p, index=i))
    return problems


def _output_problems(spec: PipelineSpec, index: dict[str, int]) -> list[Problem]:
    problems: list[Problem] = []
    try:
        refs = find_refs(spec.output)
    except ReferenceError_ as e:
        return [Problem(None, "output", str(e))]
    for ref in refs:
        if ref.root in ("item", "item_index"):
            problems.append(Problem(None, "output", f"{ref.text} is only available in for_each"))
        elif ref.step_id is not None and ref.step_id not in index:
            problems.append(
                Problem(
                    None,
                    "output",
                    f"reference {ref.text} names unknown step {ref.step_id!r}",
                    suggest(ref.step_id, index),
                )
            )
    return problems


def _pipeline_concurrency_problems(c: Concurrency) -> list[Problem]:
    """A pipeline's key is known before any step runs: it may refer to inputs only."""
    try:
        refs = find_refs(c.key)
    except ReferenceError_ as e:
        return [Problem(None, "concurrency.key", str(e))]
    return [
        Problem(
            None,
            "concurrency.key",
            f"{ref.text} is not available before the steps run (use inputs)",
        )
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
