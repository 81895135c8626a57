from __future__ import annotations

import pytest

from aiworker.schemas.refs import (
    ReferenceError_,
    ReferenceLimitError,
    find_refs,
    json_depth,
    parse_ref,
    resolve,
)

SCOPE = {
    "inputs": {"url": "https://x", "n": 3, "tags": ["a", "b"]},
    "steps": {
        "scrape": {"status": "succeeded", "outputs": {"data": {"title": "T", "items": [{"p": 1}]}}}
    },
}


def test_exact_reference_keeps_json_type() -> None:
    assert resolve("${{ inputs.n }}", SCOPE) == 3
    assert resolve("${{inputs.tags}}", SCOPE) == ["a", "b"]
    assert resolve("${{ steps.scrape.outputs.data }}", SCOPE) == {"title": "T", "items": [{"p": 1}]}
    assert resolve("${{ steps.scrape.outputs.data.items[0].p }}", SCOPE) == 1
    assert resolve("${{ steps.scrape.status }}", SCOPE) == "succeeded"


def test_embedded_reference_is_text() -> None:
    assert resolve("n=${{ inputs.n }} tags=${{ inputs.tags }}", SCOPE) == 'n=3 tags=["a","b"]'


def test_escape_and_untouched_json_schema() -> None:
    assert resolve("$${{ inputs.n }}", SCOPE) == "${{ inputs.n }}"
    assert resolve("cost $${{ x }} and ${{ inputs.n }}", SCOPE) == "cost ${{ x }} and 3"
    schema = {"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}}
    assert resolve({"schema": schema}, SCOPE) == {"schema": schema}
    assert find_refs(schema) == []


def test_item_scope() -> None:
    scope = {**SCOPE, "item": {"u": "x"}, "item_index": 4}
    assert resolve({"a": "${{ item.u }}", "i": "${{ item_index }}"}, scope) == {"a": "x", "i": 4}


@pytest.mark.parametrize(
    "bad",
    ["${{ }}", "${{ nope.x }}", "${{ steps.a }}", "${{ steps.a.inputs }}", "${{ inputs.a b }}"],
)
def test_malformed_references(bad: str) -> None:
    with pytest.raises(ReferenceError_):
        find_refs({"x": bad})


def test_missing_path_names_where_it_stopped() -> None:
    with pytest.raises(ReferenceError_, match="inputs has no 'missing'"):
        resolve("${{ inputs.missing }}", SCOPE)


def test_json_depth_counts_mappings_and_lists_only() -> None:
    """Dicts, other mappings and lists nest; tuples, bytes and scalars do not; past
    the limit is refused, at it is not."""
    from types import MappingProxyType

    assert json_depth("s", 0) == 0 and json_depth((1, [2]), 0) == 0
    assert json_depth([], 1) == 1 and json_depth({}, 1) == 1
    value = {"a": [1, "x", None, {"b": MappingProxyType({"c": [(1, [2])]})}], "d": 2.5}
    assert json_depth(value, 5) == 5
    with pytest.raises(ReferenceLimitError):
        json_depth(value, 4)
    deep: list[object] = []
    for _ in range(200):
        deep = [deep, 1, "s"]
    assert json_depth(deep, 201) == 201
    with pytest.raises(ReferenceLimitError):
        json_depth(deep, 200)


@pytest.mark.parametrize("expr", ["steps.a.outputs.٣", "steps.a.outputs[٣]", "inputs.x.²"])
def test_an_index_is_ascii_digits_only(expr: str) -> None:
    # Unicode digits ("٣" is one to re's \d and to int()) are no index: a bad
    # reference naming the segment, as any other character outside the grammar
    with pytest.raises(ReferenceError_, match="bad reference"):
        parse_ref(expr)
