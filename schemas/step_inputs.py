"""Each step's literal input against its worker's contract, before anything runs.

The part of the pipeline check that needs the workers' specs (and nothing
from the process's settings), run by :func:`~aiworker.schemas.pipeline_check.
parse_pipeline` in the CLI, the Python client and at workflow start:

- **Inputs against ``input_schema``** (the step's worker, and its ``fallback``
  worker). A ``${{ ... }}`` reference stands for a value not known yet, so the
  input is validated as written and every error a reference could make go away
  is dropped: any error on a whole-string reference (it may become any JSON
  value), any but a ``type`` error on an interpolated string (it is a string,
  of unknown content), and errors that compare a value holding references as a
  whole (``enum``, ``const``, ``not``, ...). An ``anyOf``/``oneOf`` fails only
  when every branch keeps an error, and is reported at its most relevant
  branch (:func:`~aiworker.schemas.messages.issues`), so ``selectr`` inside an
  extraction field is named, with ``selector`` as a suggestion.
- **References**: ``inputs.<path>`` must exist in the pipeline's ``inputs``;
  ``steps.<id>.outputs.<path>`` must be a place the step's outputs can have:
  the worker's ``output_schema``, narrowed for the built-in workers by what
  the step's input makes (:mod:`~aiworker.schemas.output_shapes`: web-scrape's
  fields and content, llm-call's ``response_schema``, aggregator's policy);
  checked only where the schema forbids other keys, so a reference is
  refused only when it cannot resolve.
- **A step cache** (``cache``) on a worker that may not have one: one with
  ``side_effects`` (publish: a skipped call would skip its effect), or an
  external one (the cache lives in aiworker's worker runtime, which another
  process's worker does not run); the step's ``fallback`` worker alike.
- **What workers compile**: a web-scrape step's CSS selectors and ``regex``
  fields (the worker's own compile step,
  :mod:`~aiworker.schemas.extraction_spec`), its ``discover``
  (:mod:`~aiworker.schemas.discover_spec`), and literal JSON Schemas given to
  a validator (``schema``) or llm-call (``response_schema``), checked as
  :mod:`~aiworker.schemas.safe_schema` applies them.

Pure and deterministic: it runs inside the workflow sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from jsonschema.exceptions import SchemaError, _Error

from aiworker.schemas import names, safe_schema
from aiworker.schemas.discover_spec import compile_discover
from aiworker.schemas.extraction_spec import SpecError, compile_selector, compile_spec
from aiworker.schemas.flow import collects, run_inputs
from aiworker.schemas.messages import issues, json_path, suggest
from aiworker.schemas.output_shapes import ORIGIN, Shapes
from aiworker.schemas.patterns import PatternError, compile_pattern
from aiworker.schemas.pipeline import PipelineSpec, Step
from aiworker.schemas.problems import Problem
from aiworker.schemas.refs import Ref, ReferenceError_, find_refs, parse_template, walk
from aiworker.schemas.spec import WorkerSpec

# The input field in which a built-in worker takes a JSON Schema to apply.
SCHEMA_INPUTS = {names.VALIDATOR: "schema", names.LLM_CALL: "response_schema"}
# Keywords that judge a value as a whole: a reference anywhere inside it may change the verdict.
_WHOLE_VALUE = frozenset(
    {"enum", "const", "not", "contains", "uniqueItems", "unevaluatedProperties", "unevaluatedItems"}
)

Path = tuple[str | int, ...]


def _refs_in(value: Any) -> list[Ref] | None:
    """The references in ``value``; None when one is malformed (reported elsewhere)."""
    try:
        return find_refs(value)
    except ReferenceError_:
        return None


def _may_vary(value: Any) -> bool:
    refs = _refs_in(value)
    return refs is None or bool(refs)


def _keep(error: _Error) -> bool:
    """Whether ``error`` holds whatever the references in the input resolve to."""
    instance = error.instance
    if isinstance(instance, str) and "${{" in instance:
        try:
            parts = parse_template(instance)
        except ReferenceError_:
            return False
        if any(isinstance(p, Ref) for p in parts):
            # A whole reference may become any value; an interpolated one is a string.
            return len(parts) > 1 and error.validator == "type"
    if error.validator in ("anyOf", "oneOf"):
        if not error.context:  # oneOf: valid under several branches as written
            return not _may_vary(instance)
        failing: dict[Any, bool] = {}
        for sub in error.context:
            branch = sub.relative_schema_path[0] if sub.relative_schema_path else None
            failing[branch] = failing.get(branch, False) or _keep(sub)
        return all(failing.values())
    if error.validator in _WHOLE_VALUE or {"then", "else"} & set(error.relative_schema_path):
        return not _may_vary(instance)
    return True


def _input_problems(step: Step, i: int, field: str, value: Any, spec: WorkerSpec) -> list[Problem]:
    try:
        validator = safe_schema.cached_validator(spec.input_schema)
        errors = safe_schema.errors(validator, value)
    except SchemaError:
        return []  # the worker's own schema: the worker reports it when called
    whose = "" if field == "input" and spec.worker_id == step.worker else f"{spec.worker_id}: "
    out = []
    for e in errors:
        if not _keep(e):
            continue
        for issue in issues(e, _keep):
            at = json_path(issue.path, field)
            out.append(Problem(step.id, at, whose + issue.message, issue.suggestion, i))
    return out


def _fields_of(spec: Any) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every field object of an extraction spec, with its path (iterative)."""
    stack: list[tuple[Path, Any]] = [(("fields",), spec.get("fields"))]
    while stack:
        path, fields = stack.pop()
        if not isinstance(fields, dict):
            continue
        for name, f in fields.items():
            if isinstance(f, str):
                f = {"selector": f}
            if isinstance(f, dict):
                yield (*path, name), f
                stack.append(((*path, name, "fields"), f.get("fields")))


def _extraction_problems(step: Step, i: int, field: str, value: Any) -> list[Problem]:
    """A web-scrape input's selectors and regexes, compiled as the worker compiles them
    (each one that is written out), then the whole spec when it holds no reference."""
    spec = value.get("extraction_spec") if isinstance(value, dict) else None
    if not isinstance(spec, dict):
        return []
    out = []
    for path, f in _fields_of(spec):
        at = json_path(("extraction_spec", *path), field)
        selector, regex = f.get("selector"), f.get("regex")
        if isinstance(selector, str) and not _may_vary(selector):
            try:
                compile_selector(selector)
            except SpecError as e:
                out.append(Problem(step.id, f"{at}.selector", e.message, index=i))
        if isinstance(regex, str) and not _may_vary(regex):
            try:
                compile_pattern(regex)
            except PatternError as e:
                out.append(Problem(step.id, f"{at}.regex", str(e), index=i))
    if not out and not _may_vary(spec):
        try:
            compile_spec(spec)
        except SpecError as e:
            return [Problem(step.id, f"{field}.{e.path}", e.message, index=i)]
    return out


def _discover_problems(step: Step, i: int, field: str, value: Any) -> list[Problem]:
    """A web-scrape input names extraction_spec, discover or both; a literal
    ``discover`` compiles as the worker compiles it."""
    if not isinstance(value, dict):
        return []
    if "extraction_spec" not in value and "discover" not in value:
        why = "a web-scrape step needs extraction_spec, discover or both"
        return [Problem(step.id, field, why, index=i)]
    found = value.get("discover")
    if found is None or _may_vary(found):
        return []
    try:
        compile_discover(found)
    except SpecError as e:
        return [Problem(step.id, f"{field}.{e.path}", e.message, index=i)]
    return []


def _schema_problems(step: Step, i: int, field: str, worker: str, value: Any) -> list[Problem]:
    """A literal JSON Schema given to a validator or llm-call, checked in full."""
    key = SCHEMA_INPUTS.get(worker)
    if key is None or not isinstance(value, dict) or key not in value or _may_vary(value[key]):
        return []
    try:
        # cached by the schema's text: pipelines start with the same schemas again
        # and again, and a full metaschema check costs far more than the lookup
        safe_schema.cached_validator(value[key])
    except SchemaError as e:
        # every error of the schema at once, each a problem (the cache keeps no failures)
        found = safe_schema.problems(value[key]) or [safe_schema.problem(e)]
        return [Problem(step.id, f"{field}.{key}", p, index=i) for p in found]
    return []


def _located_refs(value: Any, root: str) -> Iterator[tuple[str, Ref]]:
    """Every reference in ``value`` with its place (``input.url``); the caps were
    checked before, so the walk is bounded."""
    stack: list[tuple[Any, Path]] = [(value, ())]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            try:
                parts = parse_template(v)
            except ReferenceError_:
                continue
            for p in parts:
                if isinstance(p, Ref):
                    yield json_path(path, root), p
        elif isinstance(v, dict):
            stack.extend((c, (*path, k)) for k, c in v.items())
        elif isinstance(v, list):
            stack.extend((c, (*path, n)) for n, c in enumerate(v))


def _missing_input(ref: Ref, inputs: Any) -> tuple[str, str | None] | None:
    """Why ``inputs.<path>`` cannot resolve (and a close key), or None when it can."""
    _, gap = walk(ref, inputs)
    if gap is None:
        return None
    cur, seg = gap.container, gap.seg
    if isinstance(cur, list) and isinstance(seg, int):
        return f"{gap.walked} has no item {seg} (it has {len(cur)})", None
    close = suggest(str(seg), cur) if isinstance(cur, dict) else None
    return f"{gap.walked} has no {str(seg)!r}", close


def _missing_output(ref: Ref, schema: Any, origin: str) -> tuple[str, str | None] | None:
    """Why ``steps.<id>.outputs.<path>`` cannot exist under ``schema`` (and a close
    key), or None when it may; only a schema that forbids other keys refuses.
    ``origin`` names the schema (``the output_schema of worker 'x'``); a derived
    object (:mod:`~aiworker.schemas.output_shapes`) names its own and lists its keys."""
    walked = "outputs"
    derived = False
    for seg in ref.path[2:]:
        if not isinstance(schema, dict) or set(schema) & {"$ref", "anyOf", "oneOf", "allOf", "if"}:
            return None
        if isinstance(schema.get(ORIGIN), str):
            origin, derived = schema[ORIGIN], True
        props = schema.get("properties") or {}
        if isinstance(seg, str) and seg in props:
            schema = props[seg]
        elif isinstance(seg, int) and schema.get("type") == "array":
            schema = schema.get("items", {})
        elif schema.get("additionalProperties") is False and not schema.get("patternProperties"):
            known = [str(k) for k in props]
            why = f"{origin} has no {walked}.{seg}"
            if derived:
                why += f" (it has: {', '.join(sorted(known))})" if known else " (it has none)"
            return why, suggest(str(seg), known)
        else:
            return None
        walked = f"{walked}.{seg}"
    return None


def _run_inputs(spec: PipelineSpec) -> dict[str, Any]:
    """The inputs a run of ``spec`` sees: the file's, and under a collecting ``flow``
    (batch, debounce ``inputs: all``) every start's as ``starts`` (the file's stands
    for each), so ``${{ inputs.starts }}`` checks like any input."""
    if spec.flow is not None and collects(spec.flow):
        return run_inputs(spec.inputs, [spec.inputs])
    return spec.inputs


def _ref_problems(
    spec: PipelineSpec,
    shapes: Shapes,
    where: tuple[str | None, int | None],
    field: str,
    value: Any,
) -> list[Problem]:
    step_id, i = where
    out = []
    for at, ref in _located_refs(value, field):
        why: tuple[str, str | None] | None = None
        if ref.root == "inputs":
            why = _missing_input(ref, _run_inputs(spec))
        elif ref.step_id is not None and len(ref.path) > 2 and ref.path[1] == "outputs":
            found = shapes.of(ref.step_id)
            if found is not None:
                why = _missing_output(ref, *found)
        if why is not None:
            out.append(Problem(step_id, at, f"{ref.text}: {why[0]}", why[1], i))
    return out


# Fields whose values are only sized, never resolved: no reference stands in them.
DEPTH_ONLY = ("inputs", "validate.schema", "wait.schema")


def step_fields(step: Step) -> list[tuple[str, Any]]:
    """A step's fields that hold user JSON, by name (the caps and the checks walk these)."""
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
    if step.wait is not None:
        fields.append(("wait.schema", step.wait.schema_))
    return fields


def cache_refusal(worker: WorkerSpec) -> str | None:
    """Why calls of ``worker`` cannot be cached (None: they can)."""
    if worker.side_effects:
        return (
            f'worker {worker.worker_id!r} has side effects ("side_effects": true in its '
            'spec): a cached result would skip them; remove "cache"'
        )
    if worker.kind == "workflow":
        return (
            f"worker {worker.worker_id!r} runs as a workflow whose turns and tool calls "
            'are its own activities: its result is not cached; remove "cache"'
        )
    if worker.kind == "external":
        return (
            f"worker {worker.worker_id!r} is external (another process runs it): the step "
            'cache works only for workers aiworker runs; remove "cache"'
        )
    return None


def step_problems(
    spec: PipelineSpec,
    workers: Mapping[str, WorkerSpec | None],
) -> list[Problem]:
    """Every problem of the steps' inputs and references under the workers' specs
    (a worker without a spec, or unknown, is checked by name only, elsewhere);
    references into a built-in step's outputs are held against what its input
    makes (:mod:`~aiworker.schemas.output_shapes`)."""
    out: list[Problem] = []
    steps = {s.id: s for s in spec.steps}
    shapes = Shapes(steps, workers)
    for i, step in enumerate(spec.steps):
        calls = [("input", step.worker, step.input)]
        if step.fallback is not None:
            fb_input = step.fallback_input if step.fallback_input is not None else step.input
            field = "fallback_input" if step.fallback_input is not None else "input"
            calls.append((field, step.fallback, fb_input))
        for field, worker_id, value in calls:
            worker = workers.get(worker_id)
            if worker is None:
                continue
            why = cache_refusal(worker) if step.cache is not None else None
            if why is not None:
                whose = "" if worker_id == step.worker else "fallback "
                out.append(Problem(step.id, "cache", whose + why, index=i))
            found = _input_problems(step, i, field, value, worker)
            if not found and worker_id == names.WEB_SCRAPE:
                found = _extraction_problems(step, i, field, value)
                found = found or _discover_problems(step, i, field, value)
            if not found:
                found = _schema_problems(step, i, field, worker_id, value)
            out.extend(p for p in found if p not in out)
        for field, value in step_fields(step):
            if field in DEPTH_ONLY:
                continue
            out.extend(_ref_problems(spec, shapes, (step.id, i), field, value))
    out.extend(_ref_problems(spec, shapes, (None, None), "output", spec.output))
    if spec.concurrency is not None:
        key = spec.concurrency.key
        out.extend(_ref_problems(spec, shapes, (None, None), "concurrency.key", key))
    if spec.flow is not None:
        out.extend(_ref_problems(spec, shapes, (None, None), "flow.key", spec.flow.key))
    return out


__all__ = ["DEPTH_ONLY", "SCHEMA_INPUTS", "cache_refusal", "step_fields", "step_problems"]
