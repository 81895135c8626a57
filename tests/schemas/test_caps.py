"""The reference scanner is one pass and the caps hold (issue 15, items 4 and 5):
counted scanner steps, references per string and pipeline, nesting walked
without recursion, resolved size counted before anything is built, and the
``AIWORKER_MAX_*`` settings with their bounds."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.caps import HARD_MAX_JSON_DEPTH, Caps
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.schemas.refs import (
    ReferenceError_,
    ReferenceLimitError,
    ResolvedSizeError,
    SizeBudget,
    find_refs,
    parse_template,
    resolve,
)

WORKERS = {"validator"}


class CountingStr(str):
    """A string that counts the searches the scanner makes in it."""

    finds = 0

    def find(self, *args: Any) -> int:  # type: ignore[override]
        CountingStr.finds += 1
        return super().find(*args)


def finds_for(text: str) -> int:
    CountingStr.finds = 0
    try:
        parse_template(CountingStr(text))
    except ReferenceError_:
        pass
    return CountingStr.finds


def test_the_scan_is_one_pass_whatever_the_string_holds() -> None:
    # 200k unclosed openers: the old lazy regex restarted a scan to the end of the
    # string at each of them; this scanner searches twice and reports the first.
    assert finds_for("${{" * 200_000) == 2
    assert finds_for("x" * 1_000_000) == 1
    # n references: one search for each opener and each closer, and a last one
    assert finds_for("${{ inputs.a }} " * 90 + "x" * 10_000) == 2 * 90 + 1
    with pytest.raises(ReferenceError_, match=r"unclosed \$\{\{ at character 5"):
        parse_template("text ${{ inputs.a " + "${{" * 1000)


def test_escapes_and_literal_text_keep_their_meaning() -> None:
    scope = {"inputs": {"n": 3}}
    assert resolve("$${{ inputs.n }}", scope) == "${{ inputs.n }}"
    assert resolve("$$${{ inputs.n }}", scope) == "$${{ inputs.n }}"
    assert resolve("a $${{ x }} b ${{ inputs.n }}", scope) == "a ${{ x }} b 3"
    # an escaped opener never needs a closer; an unescaped one does
    assert resolve("cost $${{ 5", scope) == "cost ${{ 5"
    with pytest.raises(ReferenceError_, match="unclosed"):
        resolve("cost ${{ 5", scope)


def test_references_per_string_and_string_length_are_capped() -> None:
    with pytest.raises(ReferenceLimitError, match="more than 100 references in one string"):
        find_refs("${{ inputs.a }}" * 101)
    caps = Caps(max_reference_chars=1000)
    with pytest.raises(ReferenceLimitError, match="a string of 1015 characters"):
        find_refs({"t": "${{ inputs.a }}" + "x" * 1000}, caps=caps)
    # plain text of any length is not a reference string
    assert find_refs({"t": "x" * 100_000}, caps=caps) == []


def test_nesting_is_checked_without_recursion() -> None:
    deep: Any = 1
    for _ in range(5000):  # far past Python's recursion limit
        deep = [deep]
    with pytest.raises(ReferenceLimitError, match=f"deeper than {HARD_MAX_JSON_DEPTH}"):
        find_refs({"x": deep})
    with pytest.raises(ReferenceLimitError, match=f"deeper than {HARD_MAX_JSON_DEPTH}"):
        resolve({"x": "${{ inputs.d }}"}, {"inputs": {"d": deep}})
    with pytest.raises(PipelineSpecError, match="field 'input': JSON nested deeper than 128"):
        parse_pipeline(
            {"name": "p", "steps": [{"id": "a", "worker": "validator", "input": {"d": deep}}]},
            WORKERS,
        )
    with pytest.raises(PipelineSpecError, match="field 'when': JSON nested deeper than 128"):
        parse_pipeline(
            {
                "name": "p",
                "steps": [
                    {
                        "id": "a",
                        "worker": "validator",
                        "when": {"value": 1, "schema": {"items": deep}},
                    }
                ],
            },
            WORKERS,
        )


def test_references_per_pipeline_are_capped() -> None:
    steps = [
        {"id": f"s{i}", "worker": "validator", "input": {"data": ["${{ inputs.x }}"] * 20}}
        for i in range(6)
    ]
    spec = {"name": "p", "inputs": {"x": 1}, "steps": steps}
    parse_pipeline(spec, WORKERS)  # 120 references: under the ceiling
    with pytest.raises(PipelineSpecError, match=r"120 references .* the cap is 100 \("):
        parse_pipeline(spec, WORKERS, Caps(max_references=100))


def test_resolving_stops_at_the_cap_before_building_the_value() -> None:
    big = "x" * (1024 * 1024)
    template = [f"{i}${{{{inputs.big}}}}" for i in range(200)]
    tracemalloc.start()
    try:
        with pytest.raises(ResolvedSizeError, match="more than 4194304 bytes"):
            resolve({"data": template}, {"inputs": {"big": big}}, budget=SizeBudget(4 << 20))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # what was built: at most the cap and one more piece, never 200 MiB
    assert peak < 8 * 1024 * 1024
    # whole-value references are measured too (once per value), not only text
    whole = ["${{ inputs.doc }}"] * 200
    with pytest.raises(ResolvedSizeError):
        resolve(whole, {"inputs": {"doc": {"a": big}}}, budget=SizeBudget(4 << 20))
    assert resolve(whole[:3], {"inputs": {"doc": {"a": 1}}}) == [{"a": 1}] * 3


def test_a_part_counts_against_its_whole() -> None:
    total = SizeBudget(1000, cap="max_foreach_bytes")
    for _ in range(10):  # 100 characters each (the quotes count)
        resolve("x" * 98, {}, budget=total.part(200))
    with pytest.raises(ResolvedSizeError, match="AIWORKER_MAX_FOREACH_BYTES"):
        resolve("x" * 98, {}, budget=total.part(200))
    with pytest.raises(ResolvedSizeError, match="AIWORKER_MAX_RESOLVED_BYTES"):
        resolve("x" * 300, {}, budget=SizeBudget(1000).part(200))


def test_caps_come_from_settings_within_their_bounds() -> None:
    env = {
        "AIWORKER_MAX_FOREACH_ITEMS": "500000",
        "AIWORKER_MAX_STEPS": "50",
        "AIWORKER_MAX_JSON_DEPTH": "32",
        "AIWORKER_MAX_REFERENCE_CHARS": "4096",
        "AIWORKER_MAX_REFERENCES": "200",
        "AIWORKER_MAX_RESOLVED_BYTES": "1048576",
        "AIWORKER_MAX_FOREACH_BYTES": "8388608",
    }
    caps = Settings.from_env(env).caps
    assert caps == Caps(
        max_foreach_items=500_000,
        max_steps=50,
        max_json_depth=32,
        max_reference_chars=4096,
        max_references=200,
        max_resolved_bytes=1 << 20,
        max_foreach_bytes=8 << 20,
    )
    assert Settings.from_env({}).caps.max_foreach_items == 100_000
    for name, value in (
        ("AIWORKER_MAX_JSON_DEPTH", "129"),
        ("AIWORKER_MAX_FOREACH_ITEMS", "0"),
        ("AIWORKER_MAX_STEPS", "201"),
        ("AIWORKER_MAX_RESOLVED_BYTES", "lots"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})


def test_steps_are_capped_by_settings() -> None:
    steps = [{"id": f"s{i}", "worker": "validator", "input": {}} for i in range(3)]
    with pytest.raises(PipelineSpecError, match=r"3 steps; the cap is 2 \(AIWORKER_MAX_STEPS\)"):
        parse_pipeline({"name": "p", "steps": steps}, WORKERS, Caps(max_steps=2))
