"""The fast check in front of jsonschema (``schemas/fast_valid.py``): whatever it is
sure of, the safe validator finds no error in; the built-in specs' schemas get one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import SchemaError

from aiworker.config.catalog import load_specs
from aiworker.schemas import safe_schema
from aiworker.schemas.fast_valid import compile_fast

KEYS = ["a", "b", "url", "n"]
PATTERNS = ["^[a-z]+$", "x", "^[0-9a-f]{4}$", "(?i)^HT"]
FORMATS = ["date-time", "email", "uri", "ipv4", "uuid", "no-such-format"]
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]

numbers = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([0.0, 1.0, 2.5, -1.5, 3.0, float("nan"), float("inf"), 10**20]),
)
strings = st.one_of(
    st.sampled_from(
        [
            "",
            "abc",
            "ABC",
            "HTTP",
            "http://h.test/x",
            "00ff",
            "2026-11-29T05:00:00.123+00:00",
            "2026-13-29",
            "a@b.test",
            "10.0.0.1",
            "123e4567-e89b-12d3-a456-426614174000",
            "é",
            "x" * 9,
        ]
    ),
    st.text(max_size=6),
)
scalars = st.one_of(
    st.sampled_from([None, True, False, 0, 1, 3, -1, 2.5, 3.0, -1.5, float("nan"), 10**20]),
    numbers,
    strings,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
        st.lists(inner, max_size=2).map(tuple),
    ),
    max_leaves=12,
)


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    types = st.one_of(
        st.sampled_from(TYPES),
        st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
    )
    # one keyword alone as often as several together
    alone = st.one_of(
        st.fixed_dictionaries({"type": types}),
        st.fixed_dictionaries({"minimum": st.integers(-5, 5)}),
        st.fixed_dictionaries({"maxLength": st.integers(0, 6)}),
        st.fixed_dictionaries({"maxItems": st.integers(0, 3)}),
        st.fixed_dictionaries({"format": st.sampled_from(FORMATS)}),
        st.fixed_dictionaries({"pattern": st.sampled_from(PATTERNS)}),
    )
    several = st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(
                st.sampled_from(TYPES),
                st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
            ),
            "minimum": numbers.filter(lambda n: n == n and abs(n) != float("inf")),
            "exclusiveMaximum": st.integers(-5, 5),
            "maxLength": st.integers(0, 6),
            "minLength": st.integers(0, 3),
            "minItems": st.integers(0, 3),
            "maxItems": st.integers(0, 3),
            "pattern": st.sampled_from(PATTERNS),
            "format": st.sampled_from(FORMATS),
            "enum": st.lists(strings, min_size=1, max_size=3, unique=True),
            "description": st.just("annotation"),
        },
    )
    return st.one_of(alone, several)


def _schemas() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(_leaf(), st.just(True)),
        lambda inner: st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "type": st.just("object"),
                    "properties": st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
                    "required": st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
                    "additionalProperties": st.one_of(st.booleans(), inner),
                },
            ),
            st.fixed_dictionaries({"items": inner}, optional={"type": st.just("array")}),
            # beyond the fast check: it must decline
            st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
        ),
        max_leaves=6,
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas(), st.lists(values, min_size=1, max_size=8))
# each keyword's way to fail, as a named case beside the generated ones
@example({"type": "integer"}, [2.5, 3.0, True, 10**20])
@example({"type": ["number", "null"]}, [True, "1", float("inf")])
@example({"enum": ["a", "b"]}, ["c", 1, None])
@example({"minimum": 3, "exclusiveMaximum": 5}, [2, 2.5, 5, 4.5])
@example({"maxLength": 2, "minItems": 1}, ["abc", [], "é"])
@example({"required": ["a"], "properties": {"a": {"type": "string"}}}, [{}, {"a": 1}])
@example({"additionalProperties": False, "properties": {"a": True}}, [{"b": 1}])
@example({"items": {"type": "string"}}, [[1], ["a", None]])
@example({"pattern": "^[a-z]+$", "format": "date-time"}, ["A", "2026-13-29T00:00:00Z"])
def test_what_the_fast_check_is_sure_of_jsonschema_finds_valid(
    schema: Any, instances: list[Any]
) -> None:
    try:
        validator = safe_schema.validator(schema)
    except SchemaError:
        assume(False)
        return
    fast = compile_fast(schema, safe_schema.FORMATS)
    if fast is None:
        return
    for value in instances:
        if fast(value):
            assert safe_schema.errors(validator, value) == [], (schema, value)


def test_declines_what_it_does_not_cover() -> None:
    for schema in (
        {"anyOf": [{"type": "string"}]},
        {"$ref": "#/$defs/x", "$defs": {"x": {}}},
        {"enum": [1, "a"]},
        {"properties": {"a": False}},
        {"type": "string", "const": "a"},
    ):
        assert compile_fast(schema, safe_schema.FORMATS) is None, schema


@pytest.mark.parametrize("worker_id", ["web-scrape", "validator", "llm-call"])
def test_the_built_in_outputs_get_a_fast_check(worker_id: str) -> None:
    spec = load_specs()[worker_id]
    assert compile_fast(spec.output_schema, safe_schema.FORMATS) is not None
