"""Count what a pipeline asks the checks to compile, before anything compiles.

A pipeline's literal JSON Schemas are checked against the metaschema and its
patterns compiled by RE2; both cost time per subschema and per pattern, so a
pipeline with 17,000 patterns held ``serve``'s event loop for 13 s and tripped
the workflow's deadlock detector. :func:`compile_cap_problems` counts them in
one pass over the literal values (distinct schemas and patterns only: the same
one compiles once) against the fixed caps of :mod:`~aiworker.schemas.caps`
(``MAX_PIPELINE_*``, ``MAX_WORKFLOW_*``), so every check costs bounded time.

Pure and deterministic: it runs inside the workflow sandbox too. Nesting was
capped before this runs (:func:`~aiworker.schemas.pipeline_check.cap_problems`);
the walks are iterative anyway.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from aiworker.schemas import names
from aiworker.schemas.caps import (
    MAX_PIPELINE_PATTERN_CHARS,
    MAX_PIPELINE_PATTERNS,
    MAX_PIPELINE_SCHEMA_NODES,
    MAX_PIPELINE_SCHEMAS,
    MAX_WORKFLOW_PATTERNS,
    MAX_WORKFLOW_SCHEMA_NODES,
)
from aiworker.schemas.pipeline import PipelineSpec, Step
from aiworker.schemas.problems import Problem

# The input field in which a built-in worker takes a JSON Schema (as step_inputs.SCHEMA_INPUTS).
_SCHEMA_INPUTS = {names.VALIDATOR: "schema", names.LLM_CALL: "response_schema"}
# Keywords whose value is data, never a schema: counted as one value.
_DATA = frozenset({"const", "enum", "default", "examples", "required", "dependentRequired"})


def _schema_nodes_and_patterns(schema: Any) -> tuple[int, list[str]]:
    """The JSON values of ``schema`` and the patterns in it (``pattern`` strings,
    ``patternProperties`` names)."""
    nodes = 0
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        nodes += 1
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            pp = node.get("patternProperties")
            if isinstance(pp, dict):
                found.extend(k for k in pp if isinstance(k, str))
            for key, value in node.items():
                if key in _DATA:
                    nodes += 1
                else:
                    stack.append(value)
    return nodes, found


def _extraction_patterns(spec: Any) -> Iterator[str]:
    """The ``regex`` of every field of an extraction spec (iterative)."""
    stack = [spec.get("fields") if isinstance(spec, dict) else None]
    while stack:
        fields = stack.pop()
        if not isinstance(fields, dict):
            continue
        for f in fields.values():
            if isinstance(f, dict):
                if isinstance(f.get("regex"), str):
                    yield f["regex"]
                stack.append(f.get("fields"))


def _literals(step: Step) -> Iterator[tuple[str, Any, bool]]:
    """``(field, schema, applied in the workflow)`` for each literal schema of ``step``,
    then ``(field, pattern, False)`` for each pattern outside schemas (as a str)."""
    if isinstance(step.when, dict) and "schema" in step.when:
        yield "when.schema", step.when["schema"], True
    if step.validate_ is not None:
        yield "validate.schema", step.validate_.schema_, True
    if step.wait is not None:
        yield "wait.schema", step.wait.schema_, True
    for field, worker, value in (
        ("input", step.worker, step.input),
        ("fallback_input", step.fallback, step.fallback_input),
    ):
        if not isinstance(value, dict):
            continue
        key = _SCHEMA_INPUTS.get(worker or "")
        if key is not None and key in value:
            yield f"{field}.{key}", value[key], False
        if worker == names.WEB_SCRAPE:
            for regex in _extraction_patterns(value.get("extraction_spec")):
                yield f"{field}.extraction_spec", _Pattern(regex), False
            found = value.get("discover")
            if isinstance(found, dict) and isinstance(found.get("pattern"), str):
                yield f"{field}.discover.pattern", _Pattern(found["pattern"]), False


class _Pattern(str):
    """A pattern outside a schema (told apart from a schema that is a string)."""


def _over(what: str, count: int, cap: int, field: str | None = None) -> Problem:
    at = f" (the first over it in {field})" if field else ""
    return Problem(
        None,
        "",
        f"{count} {what} in the pipeline{at}; the cap is {cap} ({_CAP_NAMES[what]}): "
        "split the pipeline, or reuse the same schema or pattern",
    )


_CAP_NAMES = {
    "distinct JSON Schemas": "MAX_PIPELINE_SCHEMAS",
    "JSON values in its distinct schemas": "MAX_PIPELINE_SCHEMA_NODES",
    "distinct patterns": "MAX_PIPELINE_PATTERNS",
    "characters of distinct patterns": "MAX_PIPELINE_PATTERN_CHARS",
    "JSON values in its distinct when and validate schemas": "MAX_WORKFLOW_SCHEMA_NODES",
    "distinct patterns in its when and validate schemas": "MAX_WORKFLOW_PATTERNS",
}


def compile_cap_problems(spec: PipelineSpec) -> list[Problem]:
    """What of ``spec`` is over the caps on schemas and patterns (empty when none);
    each problem names the cap. Counts only: nothing is compiled."""
    schemas: set[str] = set()
    workflow_schemas: set[str] = set()
    patterns: set[str] = set()
    workflow_patterns: set[str] = set()
    nodes = workflow_nodes = chars = 0
    first: dict[str, str] = {}

    def note(what: str, field: str) -> None:
        first.setdefault(what, field)

    for step in spec.steps:
        for field, value, in_workflow in _literals(step):
            where = f"step {step.id!r} {field}"
            if isinstance(value, _Pattern):
                if value not in patterns:
                    patterns.add(value)
                    chars += len(value)
                continue
            text = json.dumps(value, sort_keys=True, separators=(",", ":"))
            seen = text in schemas
            fresh_here = in_workflow and text not in workflow_schemas
            if seen and not fresh_here:
                continue
            n, found = _schema_nodes_and_patterns(value)
            if not seen:
                schemas.add(text)
                nodes += n
                for p in found:
                    if p not in patterns:
                        patterns.add(p)
                        chars += len(p)
            if fresh_here:
                workflow_schemas.add(text)
                workflow_nodes += n
                workflow_patterns.update(found)
            for what, count, cap in (
                ("distinct JSON Schemas", len(schemas), MAX_PIPELINE_SCHEMAS),
                ("JSON values in its distinct schemas", nodes, MAX_PIPELINE_SCHEMA_NODES),
                (
                    "JSON values in its distinct when and validate schemas",
                    workflow_nodes,
                    MAX_WORKFLOW_SCHEMA_NODES,
                ),
                (
                    "distinct patterns in its when and validate schemas",
                    len(workflow_patterns),
                    MAX_WORKFLOW_PATTERNS,
                ),
            ):
                if count > cap:
                    note(what, where)
        if len(patterns) > MAX_PIPELINE_PATTERNS:
            note("distinct patterns", f"step {step.id!r}")
        if chars > MAX_PIPELINE_PATTERN_CHARS:
            note("characters of distinct patterns", f"step {step.id!r}")
    counts = {
        "distinct JSON Schemas": (len(schemas), MAX_PIPELINE_SCHEMAS),
        "JSON values in its distinct schemas": (nodes, MAX_PIPELINE_SCHEMA_NODES),
        "distinct patterns": (len(patterns), MAX_PIPELINE_PATTERNS),
        "characters of distinct patterns": (chars, MAX_PIPELINE_PATTERN_CHARS),
        "JSON values in its distinct when and validate schemas": (
            workflow_nodes,
            MAX_WORKFLOW_SCHEMA_NODES,
        ),
        "distinct patterns in its when and validate schemas": (
            len(workflow_patterns),
            MAX_WORKFLOW_PATTERNS,
        ),
    }
    return [
        _over(what, count, cap, first.get(what))
        for what, (count, cap) in counts.items()
        if count > cap
    ]


__all__ = ["compile_cap_problems"]
