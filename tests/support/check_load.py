"""Pipelines that cost the pipeline check time (issue 31, item 3).

:func:`many_patterns` is the pipeline of the report: 85 validator steps with
17,000 distinct patterns in about 1 MiB, over the caps on schemas and patterns.
:func:`heavy_under_caps` stays under every cap but takes the check about a
second or two (its schemas are as many JSON values as the caps allow), the
load under which the front door and the workflow must stay responsive.
"""

from __future__ import annotations

from typing import Any

from aiworker.schemas.caps import MAX_PIPELINE_SCHEMA_NODES, MAX_PIPELINE_SCHEMAS


def many_patterns(steps: int = 85, per_step: int = 200) -> dict[str, Any]:
    """``steps`` validator steps, each with a schema of ``per_step`` distinct patterns."""
    out = []
    n = 0
    for s in range(steps):
        props = {}
        for j in range(per_step):
            props[f"f{j}"] = {"type": "string", "pattern": f"^p{n}_[a-z]{{1,{n % 50 + 1}}}x?$"}
            n += 1
        schema = {"type": "object", "properties": props}
        out.append({"id": f"v{s}", "worker": "validator", "input": {"data": {}, "schema": schema}})
    return {"name": "many-patterns", "steps": out}


def heavy_under_caps(salt: str = "", bad_pattern: str | None = None) -> dict[str, Any]:
    """As many distinct schemas and JSON values as the caps allow, in validator steps
    (``MAX_PIPELINE_SCHEMAS`` schemas of ``MAX_PIPELINE_SCHEMA_NODES`` values in all);
    ``salt`` makes them new to a process's caches; ``bad_pattern`` in the last one
    makes the full check refuse it."""
    per = MAX_PIPELINE_SCHEMA_NODES // MAX_PIPELINE_SCHEMAS  # values per schema
    branches = (per - 3) // 2  # root, anyOf list, $comment; each branch is two values
    out = []
    for s in range(MAX_PIPELINE_SCHEMAS):
        schema: dict[str, Any] = {
            "$comment": f"schema {s} {salt}",
            "anyOf": [{"minLength": k} for k in range(branches)],
        }
        if bad_pattern is not None and s == MAX_PIPELINE_SCHEMAS - 1:
            schema["anyOf"][0] = {"pattern": bad_pattern}
        out.append({"id": f"v{s}", "worker": "validator", "input": {"data": "x", "schema": schema}})
    return {"name": "heavy-check", "steps": out}
