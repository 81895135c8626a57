"""The one validator aiworker builds (``schemas/safe_schema.py``): worker specs with
remote references or patterns RE2 refuses fail to load; what the check accepts
and refuses, and where it says the problem is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.loopback import upstream

from aiworker.config.catalog import builtin_spec
from aiworker.config.settings import Settings
from aiworker.schemas import names, safe_schema
from aiworker.workers.process.worker_set import PluginError, load_workers


def _external(worker_id: str, **schemas: Any) -> dict[str, Any]:
    """The validator's spec as an external worker's, with ``schemas`` replaced."""
    spec = builtin_spec(names.VALIDATOR).model_dump(mode="json", by_alias=True)
    return {**spec, "worker_id": worker_id, "implementation": {"kind": "external"}, **schemas}


def _load(tmp_path: Path, spec: dict[str, Any]) -> str:
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    (folder / f"{spec['worker_id']}.json").write_text(json.dumps(spec))
    with pytest.raises(PluginError) as e:
        load_workers(Settings(data_dir=tmp_path, worker_specs=(folder,)))
    return str(e.value)


def test_a_worker_spec_with_a_remote_ref_fails_to_load(tmp_path: Path) -> None:
    with upstream() as server:
        url = server.base_url + "/out.json"
        message = _load(tmp_path, _external("remote", output_schema={"$ref": url}))
        refs = _load(
            tmp_path,
            _external(
                "relative",
                input_schema={"type": "object", "properties": {"a": {"$ref": "a.json#/x"}}},
            ),
        )
    assert server.total == 0
    assert f"remote.json: output_schema: $ref '{url}' is not local" in message
    assert "aiworker never fetches schemas" in message
    assert "remote.json" in message
    assert "$ref 'a.json#/x' is not local" in refs and "at /properties/a" in refs


def test_a_worker_spec_with_a_pattern_re2_refuses_fails_to_load(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}}
    message = _load(tmp_path, _external("backref", input_schema=schema))
    assert "input_schema" in message
    assert "RE2 (linear time, no backreferences or lookaround)" in message
    assert "/properties/a/pattern" in message


@pytest.mark.parametrize(
    ("schema", "value", "valid"),
    [
        ({"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}}, "x", True),
        ({"$ref": "#s", "$defs": {"s": {"$anchor": "s", "type": "string"}}}, 1, False),
        ({"properties": {"$ref": {"type": "string"}}}, {"$ref": "http://x"}, True),
        ({"enum": [{"$ref": "http://x"}]}, {"$ref": "http://x"}, True),
        ({"pattern": "^(a+)+$"}, "a" * 29 + "b", False),
        ({"pattern": "b"}, "\ud800b", True),  # lone surrogates: JSON allows them
        ({"format": "regex"}, "(?=a)", False),
        ({"format": "email"}, "not an email", False),
    ],
)
def test_what_the_safe_validator_applies(schema: Any, value: Any, valid: bool) -> None:
    assert safe_schema.is_valid(schema, value) is valid


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"$ref": "http://127.0.0.1:9/x"}, "$ref 'http://127.0.0.1:9/x' is not local"),
        ({"$dynamicRef": "file:///etc/passwd"}, "$dynamicRef 'file:///etc/passwd' is not local"),
        ({"$id": "https://example.com/s"}, "$id 'https://example.com/s' is not local"),
        (
            {"items": {"$ref": "#/$defs/none"}},
            "$ref '#/$defs/none' resolves to nothing in this schema at /items",
        ),
        ({"patternProperties": {"(?<=a)": {}}}, 'patternProperties name "(?<=a)" is not supported'),
        ({"type": "wrong"}, "invalid JSON Schema at /type"),
    ],
)
def test_what_the_check_refuses_and_where(schema: Any, problem: str) -> None:
    with pytest.raises(safe_schema.SchemaError) as e:
        safe_schema.check(schema)
    assert problem in safe_schema.problem(e.value)


def test_nesting_is_bounded_before_anything_recurses() -> None:
    schema: dict[str, Any] = {}
    node = schema
    for _ in range(safe_schema.MAX_DEPTH + 1):
        node["items"] = {}
        node = node["items"]
    with pytest.raises(safe_schema.SchemaRefused, match="nested deeper than"):
        safe_schema.check(schema)
    # a schema that refers to itself meets a value deeper than the stack: refused, not a crash
    deep: list[Any] = []
    cur = deep
    for _ in range(5000):
        cur.append([])
        cur = cur[0]
    with pytest.raises(safe_schema.SchemaRefused, match="refers to itself"):
        safe_schema.is_valid({"items": {"$ref": "#"}}, deep)
