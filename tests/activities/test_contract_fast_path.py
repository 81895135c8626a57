"""jsonschema-rs in front of jsonschema (``activities/contracts.py``): a value it finds
valid is valid for safe_schema too, it stands aside wherever the two could differ,
and every error still comes from jsonschema."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.schema_values import error_tuples, mutation

from aiworker.activities.contracts import Contract, plain_json, rs_shares, rs_validator
from aiworker.config.catalog import load_specs
from aiworker.schemas import safe_schema
from aiworker.schemas.safe_schema import cached_validator

_SHA = "0123456789abcdef" * 4
# Valid outputs of the workers whose outputs the benches check on every call.
OUTPUTS: dict[str, dict[str, Any]] = {
    "validator": {
        "valid": False,
        "errors": [{"path": "$.a", "message": "m", "validator": "type", "schema_path": "$.type"}],
        "truncated": True,
    },
    "web-scrape": {
        "data": {"title": "Product 1", "price": "37.99", "tags": ["a", "b"]},
        "source": {
            "url": "http://127.0.0.1:8000/p/1.html",
            "final_url": "http://127.0.0.1:8000/p/1.html",
            "status_code": 200,
            "fetched_at": "2026-12-07T21:26:10.483Z",
            "content_type": "text/html; charset=utf-8",
            "encoding": "utf-8",
            "bytes": 5718,
            "sha256": _SHA,
            "elapsed_ms": 5.3,
            "redirects": [],
            "not_modified": False,
        },
        "warnings": [{"code": "field_missing", "message": "m", "field": "data.x"}],
    },
}


def test_every_builtin_contract_gives_jsonschema_s_errors_with_the_fast_check_in_front() -> None:
    """Each built-in spec's example inputs, the outputs above and thousands of broken
    versions of them: the contract's errors are jsonschema's, error for error, and
    the fast check answered for many of the valid ones."""
    rng = random.Random(48)
    fast_answers = 0
    specs = load_specs()
    cases = [(s.input_schema, e.input) for s in specs.values() for e in s.examples]
    cases += [(specs[w].output_schema, out) for w, out in OUTPUTS.items()]
    for schema, base in cases:
        contract, full = Contract(schema, remember=False), cached_validator(schema)
        assert not safe_schema.errors(full, base)
        for i in range(300):
            value = base if i == 0 else mutation(base, rng)
            expected = error_tuples(safe_schema.errors(full, value))
            assert error_tuples(contract.errors(value)) == expected, (schema.get("title"), value)
            if not expected and contract.fast is not None:
                fast_answers += contract.fast.is_valid(value)
    assert fast_answers > 100


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        # NaN reads as null in jsonschema-rs; a number (not null) for jsonschema
        ({"type": "null"}, float("nan")),
        ({"enum": [None]}, float("inf")),
        # a tuple is an array in jsonschema-rs, not for jsonschema
        ({"type": "array"}, (1, 2)),
        ({"type": "object", "properties": {"a": {"type": "array"}}}, {"a": ("x",)}),
        # past 2**53 Rust may compare floats
        ({"type": "integer", "maximum": 2**60}, 2**60 + 1),
        # a non-string key
        ({"type": "object", "maxProperties": 1}, {1: "a", "b": 2}),
    ],
)
def test_values_jsonschema_rs_reads_otherwise_go_to_jsonschema(schema: Any, value: Any) -> None:
    contract = Contract(schema, remember=False)
    assert contract.fast is not None
    expected = error_tuples(safe_schema.errors(cached_validator(schema), value))
    assert expected  # each is invalid for safe_schema
    assert error_tuples(contract.errors(value)) == expected
    assert not plain_json(value, exact=True)


def test_a_lone_surrogate_is_checked_by_jsonschema() -> None:
    """jsonschema-rs cannot encode it (it raises); jsonschema checks it as a string."""
    contract = Contract({"type": "string", "maxLength": 3}, remember=False)
    assert contract.errors("\ud800b") == []
    assert [e.validator for e in contract.errors("\ud800bcd")] == ["maxLength"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "\\d+"},
        {"type": "string", "pattern": "^a.c$"},
        {"type": "string", "pattern": "a{,3}"},
        {"type": "string", "pattern": "[]a]"},
        {"type": "object", "patternProperties": {"^a": {}}},
        {"type": "number", "multipleOf": 0.1},
        {"type": "object", "unevaluatedProperties": False},
        {"type": "array", "unevaluatedItems": False},
        # a property named "pattern" whose schema is an object: refused all the same
        {"type": "object", "properties": {"pattern": {"type": "string"}}},
    ],
)
def test_no_fast_check_where_the_two_could_differ(schema: dict[str, Any]) -> None:
    assert rs_validator(schema) is None
    assert Contract(schema, remember=False).fast is None


def test_a_schema_jsonschema_rs_does_not_compile_has_no_fast_check() -> None:
    # a remote reference: jsonschema-rs asks its retriever, which refuses (safe_schema
    # refuses the spec before any contract is made)
    assert rs_validator({"$ref": "https://example.com/schema.json"}) is None


@pytest.mark.parametrize("pattern", ["^[0-9a-f]{64}$", "^https?://", "x{2,}", "^(ab|cd)+$"])
def test_plain_patterns_keep_the_fast_check(pattern: str) -> None:
    assert rs_shares({"type": "string", "pattern": pattern})
    assert rs_validator({"type": "string", "pattern": pattern}) is not None


def _pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "0", "Z", "[a-c]", "[^b]", "[0-9]", "[A-Za-z_]", ":", "/", "-"]
    if depth < 2:
        atoms.append(
            "(" + "|".join(_pattern(rng, depth + 1) for _ in range(rng.randint(1, 2))) + ")"
        )
    out = "^" if rng.random() < 0.4 else ""
    for _ in range(rng.randint(1, 4)):
        out += rng.choice(atoms) + rng.choice(["", "", "*", "+", "?", "{2}", "{1,3}", "{2,}"])
    return out + ("$" if rng.random() < 0.4 else "")


def test_generated_patterns_of_the_shared_subset_agree_with_re2() -> None:
    """Patterns of the subset jsonschema-rs keeps (built from classes, groups,
    alternation, counted repetition and anchors) on strings with line breaks,
    non-ASCII letters and digits: jsonschema-rs and safe_schema (RE2) agree."""
    rng = random.Random(480)
    alphabet = ["a", "b", "c", "0", "9", "Z", "_", ":", "/", "-", "\n", "é", "٣", "\uff21", " "]
    compared = 0
    for _ in range(300):
        schema = {"type": "string", "pattern": _pattern(rng)}
        assert rs_shares(schema), schema
        fast, full = rs_validator(schema), cached_validator(schema)
        assert fast is not None
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
            expected = not safe_schema.errors(full, text)
            assert bool(fast.is_valid(text)) == expected, (schema, text)
            compared += 1
    assert compared == 12_000
