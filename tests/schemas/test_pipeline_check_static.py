"""The settings-free pipeline check with the workers' specs: each step's literal input
against its worker's contract, references to inputs and outputs, selectors, regexes
and literal JSON Schemas, every problem naming step, field and JSON path, in JSON
terms, with a close match where there is one."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from aiworker.config.catalog import load_specs
from aiworker.schemas.messages import format_error, json_text, reasons
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.schemas.problems import Problem

SPECS = dict(load_specs())
SCRAPE_INPUT = {"url": "${{ inputs.site }}", "extraction_spec": {"fields": {"title": "h1"}}}


def problems(*steps: dict[str, Any], **pipeline: Any) -> list[Problem]:
    raw = {"name": "p", "inputs": {"site": "https://shop.example/"}, "steps": list(steps)}
    try:
        parse_pipeline({**raw, **pipeline}, SPECS)
    except PipelineSpecError as e:
        assert e.problems == [str(p) for p in e.details]
        return e.details
    return []


def scrape(fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "scrape",
        "worker": "web-scrape",
        "input": {"url": "${{ inputs.site }}", "extraction_spec": {"fields": fields}, **extra},
    }


def only(found: list[Problem]) -> Problem:
    assert len(found) == 1, [str(p) for p in found]
    return found[0]


def test_a_misspelled_key_in_an_extraction_field_is_named_with_its_fix() -> None:
    p = only(problems(scrape({"price": {"selectr": ".price"}})))
    assert str(p) == (
        "step 'scrape': field 'input.extraction_spec.fields.price.selectr': unknown key "
        "(did you mean 'selector'?)"
    )
    assert p.to_json() == {
        "step": "scrape",
        "field": "input",
        "path": "steps[0].input.extraction_spec.fields.price.selectr",
        "message": str(p),
        "suggestion": "selector",
    }


def test_an_anyof_error_names_the_bad_key_deep_in_a_record() -> None:
    items = {"selector": ".product", "many": True, "fields": {"name": {"selectr": ".n"}}}
    p = only(problems(scrape({"items": items})))
    assert p.path == "steps[0].input.extraction_spec.fields.items.fields.name.selectr"
    assert p.suggestion == "selector"
    assert "not valid under any" not in str(p) and "True" not in str(p)


def test_a_literal_input_failing_its_schema_speaks_json() -> None:
    p = only(
        problems(
            {"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}, "gate": None}}
        )
    )
    assert str(p) == "step 'v': field 'input.gate': null is not of type boolean"
    p = only(problems({"id": "v", "worker": "validator", "input": {"data": 1}}))
    assert str(p) == "step 'v': field 'input': missing required key 'schema'"


def test_a_reference_counts_as_a_valid_value_wherever_it_stands() -> None:
    whole = {"data": 1, "schema": "${{ inputs.site }}", "gate": "${{ inputs.site }}"}
    assert problems({"id": "v", "worker": "validator", "input": whole}) == []
    # an interpolated string is a string: fine where a string goes ...
    assert problems(scrape({"t": "h1"}, user_agent="bot ${{ inputs.site }}")) == []
    # ... and a string where a boolean goes is not
    p = only(problems(scrape({"t": "h1"}, respect_robots="x ${{ inputs.site }}")))
    assert p.at == "input.respect_robots"
    assert p.message.endswith("is not of type boolean")
    # a reference inside an anyOf branch: the branch may match
    assert problems(scrape({"t": {"selector": "${{ inputs.site }}", "many": True}})) == []


def test_a_fallback_worker_checks_the_input_it_gets() -> None:
    step = {"id": "s", "worker": "validator", "input": {"data": 1, "schema": {}}}
    found = problems({**step, "fallback": "llm-call"})
    assert all(p.message.startswith("llm-call: ") for p in found)
    assert "step 's': field 'input.data': llm-call: unknown key" in [str(p) for p in found]
    found = problems({**step, "fallback": "llm-call", "fallback_input": {"promt": "x"}})
    assert found[0].at == "fallback_input.promt" and found[0].suggestion == "prompt"


def test_a_reference_to_a_missing_input_is_named_with_a_close_key() -> None:
    step = {"id": "scrape", "worker": "web-scrape", "input": {**SCRAPE_INPUT}}
    step["input"]["url"] = "${{ inputs.sitee }}"
    p = only(problems(step))
    assert str(p) == (
        "step 'scrape': field 'input.url': inputs.sitee: inputs has no 'sitee' "
        "(did you mean 'site'?)"
    )
    assert p.path == "steps[0].input.url"
    nested = only(problems(step, inputs={"doc": {"url": "https://a.example"}}))
    assert nested.message == "inputs.sitee: inputs has no 'sitee'"
    step["input"]["url"] = "${{ inputs.doc.ulr }}"
    found = only(problems(step, inputs={"doc": {"url": "https://a.example"}}))
    assert found.message == "inputs.doc.ulr: inputs.doc has no 'ulr'"
    assert found.suggestion == "url"


def test_a_reference_to_an_output_the_schema_forbids_is_refused() -> None:
    check = {"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}}
    use = {
        "id": "use",
        "worker": "validator",
        "input": {"data": "${{ steps.check.outputs.vaild }}", "schema": {}},
    }
    p = only(problems(check, use))
    assert str(p) == (
        "step 'use': field 'input.data': steps.check.outputs.vaild: the output_schema of "
        "worker 'validator' has no outputs.vaild (did you mean 'valid'?)"
    )
    # where nothing says (an extraction field's value may be any JSON): no opinion
    use["input"]["data"] = "${{ steps.scrape.outputs.data.t.anything.at.all }}"
    assert problems(scrape({"t": "h1"}), check, use) == []
    # the pipeline's output too
    out = only(problems(check, output={"ok": "${{ steps.check.outputs.valdi }}"}))
    assert (out.step, out.at, out.suggestion) == (None, "output.ok", "valid")


def test_css_selectors_and_regexes_are_compiled() -> None:
    p = only(problems(scrape({"price": {"selector": "div[[", "regex": "[0-9]+"}})))
    assert p.at == "input.extraction_spec.fields.price.selector"
    assert p.message.startswith('invalid CSS selector "div[["')
    p = only(problems(scrape({"price": {"selector": ".p", "regex": "(a)\\1"}})))
    assert p.at == "input.extraction_spec.fields.price.regex"
    assert "RE2" in p.message
    # with a reference elsewhere in the spec, the written-out selectors still compile
    spec = {"a": {"selector": "${{ inputs.site }}"}, "b": {"selector": "p:nth-child(("}}
    p = only(problems(scrape(spec)))
    assert p.at == "input.extraction_spec.fields.b.selector"


def test_literal_json_schemas_are_checked_as_json_schemas() -> None:
    bad = {"type": "objekt"}
    p = only(problems({"id": "v", "worker": "validator", "input": {"data": 1, "schema": bad}}))
    assert p.at == "input.schema"
    assert p.message.startswith('invalid JSON Schema at /type: "objekt" is not one of ["array"')
    llm = {"id": "ask", "worker": "llm-call", "input": {"prompt": "x", "response_schema": bad}}
    assert only(problems(llm)).at == "input.response_schema"
    when = {"value": 1, "schema": {"minLength": -1}}
    step = {"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}, "when": when}
    assert str(only(problems(step))) == (
        "step 'v': field 'when.schema': invalid JSON Schema at /minLength: -1 is less than "
        "the minimum of 0"
    )


def test_spec_field_problems_speak_json_and_suggest() -> None:
    found = problems(
        {"id": "a", "worker": "validator", "inptu": {}, "for_each": 5, "on_failure": "x"}
    )
    assert [str(p) for p in found] == [
        "step 'a': field 'for_each': must be a string or an array, not integer 5",
        'step \'a\': field \'on_failure\': must be "fail", "continue" or "escalate", got "x"',
        "step 'a': field 'inptu': unknown key (did you mean 'input'?)",
    ]
    p = only(problems({"id": "a", "worker": "agregator"}))
    assert p.suggestion == "aggregator"


def test_ids_alone_check_no_contract() -> None:
    step = {"id": "v", "worker": "validator", "input": {"data": 1}}
    parse_pipeline({"name": "p", "steps": [step]}, set(SPECS))


def test_the_formatter_speaks_json() -> None:
    schema = {"type": "object", "properties": {"price": {"type": "number"}}}
    (e,) = Draft202012Validator(schema).iter_errors({"price": None})
    assert format_error(e) == "$.price: null is not of type number"
    (e,) = Draft202012Validator({"enum": [True, None]}).iter_errors({"a": [1]})
    assert format_error(e) == '$: {"a":[1]} is not one of [true,null]'
    long = "x" * 500
    (e,) = Draft202012Validator({"type": "integer"}).iter_errors(long)
    assert format_error(e) == f'$: "{"x" * 79}... is not of type integer'
    assert json_text(list(range(10_000)), 10) == "[0,1,2,3,4..."
    (e,) = Draft202012Validator(
        {"properties": {"a b": {"additionalProperties": False, "properties": {"url": {}}}}}
    ).iter_errors({"a b": {"ulr": 1}})
    assert reasons([e]) == [
        {
            "path": '$["a b"].ulr',
            "message": "unknown key (did you mean 'url'?)",
            "validator": "additionalProperties",
            "schema_path": "properties/a b/additionalProperties",
        }
    ]


@pytest.mark.parametrize("worker", sorted(SPECS))
def test_every_builtin_spec_takes_a_reference_for_every_field(worker: str) -> None:
    properties = SPECS[worker].input_schema.get("properties", {})
    required = SPECS[worker].input_schema.get("required", [])
    value = {k: "${{ inputs.site }}" for k in required}
    if worker == "llm-call":
        value["prompt"] = "${{ inputs.site }}"
    if worker == "web-scrape":  # extraction_spec, discover or both
        value["extraction_spec"] = "${{ inputs.site }}"
    assert set(value) <= set(properties)
    assert problems({"id": "s", "worker": worker, "input": value}) == []
