"""The input contract's memo (``activities/contracts.py``): the same errors as a full
check, on every built-in worker's input schema, with valid parts remembered."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.schema_values import error_tuples, mutation

from aiworker.activities.contracts import MAX_REMEMBERED, Contract, heavy_properties, plain_json
from aiworker.config.catalog import builtin_spec, load_specs
from aiworker.schemas.safe_schema import cached_validator

SCRAPE_SPEC = {
    "fields": {
        "title": {"selector": "h1", "required": True},
        "items": {
            "selector": ".product",
            "many": True,
            "fields": {"name": ".name", "price": {"selector": ".price", "type": "number"}},
        },
    }
}


def test_the_memo_gives_the_errors_of_a_full_check() -> None:
    """Random valid and broken web-scrape inputs, each checked with the memo after its
    valid parts were remembered: error for error what the full check says."""
    schema = builtin_spec("web-scrape").input_schema
    memo, full = Contract(schema), cached_validator(schema)
    assert set(heavy_properties(schema)) >= {"extraction_spec", "discover"}
    rng = random.Random(29)
    base = {
        "url": "https://example.com/list?p=1",
        "extraction_spec": SCRAPE_SPEC,
        "discover": {"links": {"selector": "a.next"}, "max_urls": 50},
        "allow_domains": ["example.com"],
    }
    hits = 0
    for i in range(400):
        value = base if i % 3 == 0 else mutation(base, rng, reshape=False)
        before = len(memo._valid)
        expected = error_tuples(list(full.iter_errors(value)))
        assert error_tuples(memo.errors(value)) == expected, value
        hits += bool(before) and not expected
    assert hits > 50  # the shallow check ran, and agreed


def test_valid_parts_are_remembered_and_nothing_else() -> None:
    schema = builtin_spec("web-scrape").input_schema
    contract = Contract(schema)
    good = {"url": "https://example.com/1", "extraction_spec": SCRAPE_SPEC}
    assert contract.errors(good) == [] and len(contract._valid) == 1
    # a different URL, the same spec: the shallow check, still checking the URL
    assert contract.errors({**good, "url": "https://example.com/2"}) == []
    bad_url = contract.errors({**good, "url": "ftp://example.com/"})
    assert [e.validator for e in bad_url] == ["pattern"]
    # a broken input remembers nothing, even its valid parts
    broken = {**good, "discover": {"max_urls": 0}}
    assert [e.validator for e in contract.errors(broken)] == ["minimum"]
    assert len(contract._valid) == 1
    # a tuple is not a JSON array for the schema, though json.dumps writes it as one
    listed = {**good, "allow_domains": ["example.com"]}
    assert contract.errors(listed) == [] and len(contract._valid) == 2
    tupled = {**good, "allow_domains": ("example.com",)}
    assert [e.validator for e in contract.errors(tupled)] == ["type"]
    assert not plain_json(("a",)) and not plain_json({1: "a"}) and plain_json({"a": [1, None]})


def test_the_memo_is_bounded() -> None:
    schema = builtin_spec("web-scrape").input_schema
    contract = Contract(schema)
    for i in range(MAX_REMEMBERED + 40):
        spec = {"fields": {f"f{i}": "h1"}}
        assert contract.errors({"url": "https://example.com/", "extraction_spec": spec}) == []
    assert len(contract._valid) == MAX_REMEMBERED


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "anyOf": [{"required": ["a"]}], "properties": {"a": {"items": {}}}},
        {"type": "object", "unevaluatedProperties": False, "properties": {"a": {"$ref": "#"}}},
        {"type": "array", "items": {"type": "object"}},
    ],
)
def test_no_memo_where_it_would_not_be_exact(schema: dict[str, Any]) -> None:
    assert heavy_properties(schema) == ()


def test_every_builtin_input_schema_agrees() -> None:
    """Each built-in worker's input schema, on broken versions of a minimal input."""
    rng = random.Random(7)
    for spec in load_specs().values():
        schema = spec.input_schema
        contract, full = Contract(schema), cached_validator(schema)
        sample = {k: {} for k in heavy_properties(schema)}
        for _ in range(30):
            value = mutation(sample, rng, reshape=False)
            expected = error_tuples(list(full.iter_errors(value)))
            assert error_tuples(contract.errors(value)) == expected, (spec.worker_id, value)
