"""``check`` knows what a step outputs: a reference into a built-in step's outputs is
held against what the step's input makes (web-scrape's fields, content, metadata and
discover; llm-call's response_schema; aggregator's policy and branches) and into a
prompt worker's against its declared output_schema, with the nearest name; where the
input does not decide (a reference, a default, a fallback), nothing is refused.

Each worker kind: the typo is refused with a suggestion, the right name passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiworker.config.catalog import load_specs
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.schemas.problems import Problem
from aiworker.schemas.spec import WorkerSpec

ROOT = Path(__file__).resolve().parents[2]
SPECS: dict[str, WorkerSpec | None] = {
    **load_specs(),
    "classify-ticket": WorkerSpec.from_file(ROOT / "examples/prompts/classify-ticket.json"),
}
URL = "https://shop.example/"


def problems(*steps: dict[str, Any], output: Any = None) -> list[Problem]:
    raw: dict[str, Any] = {"name": "p", "inputs": {"spec": {}}, "steps": list(steps)}
    if output is not None:
        raw["output"] = output
    try:
        parse_pipeline(raw, SPECS)
    except PipelineSpecError as e:
        return e.details
    return []


def use(ref: str) -> dict[str, Any]:
    """A step that reads ``ref``."""
    return {
        "id": "use",
        "worker": "validator",
        "input": {"data": f"${{{{ {ref} }}}}", "schema": {}},
    }


def refused(step: dict[str, Any], ref: str) -> Problem:
    found = problems(step, use(ref))
    assert len(found) == 1, [str(p) for p in found]
    assert (found[0].step, found[0].at) == ("use", "input.data")
    return found[0]


def passes(step: dict[str, Any], *refs: str) -> None:
    for ref in refs:
        assert problems(step, use(ref)) == [], ref


def scrape(**spec: Any) -> dict[str, Any]:
    return {"id": "read", "worker": "web-scrape", "input": {"url": URL, "extraction_spec": spec}}


# --- web-scrape ---------------------------------------------------------------------------------


def test_web_scrape_content_the_issues_typo() -> None:
    step = scrape(content="article", max_content_chars=6000)
    p = refused(step, "steps.read.outputs.data.contnet.markdown")
    assert p.message == (
        "steps.read.outputs.data.contnet.markdown: the data of web-scrape step 'read' "
        "has no outputs.data.contnet (it has: content)"
    )
    assert p.suggestion == "content"
    assert str(p).endswith("(did you mean 'content'?)")
    p = refused(step, "steps.read.outputs.data.content.markdwn")
    assert p.suggestion == "markdown"
    assert "data.content of web-scrape step 'read' has no outputs.data.content.markdwn" in (
        p.message
    )
    passes(
        step,
        *(
            f"steps.read.outputs.data.content.{k}"
            for k in ("mode", "text", "markdown", "title", "byline", "published", "language")
        ),
    )


def test_web_scrape_fields_records_and_lists() -> None:
    items = {"selector": ".product", "many": True, "fields": {"name": ".n", "price": ".p"}}
    brand = {"selector": ".brand", "fields": {"label": "span"}}
    step = scrape(fields={"title": "h1", "items": items, "brand": brand})
    assert refused(step, "steps.read.outputs.data.titel").suggestion == "title"
    p = refused(step, "steps.read.outputs.data.items.0.nmae")
    assert p.suggestion == "name"
    assert "the record field 'items' of web-scrape step 'read'" in p.message
    assert refused(step, "steps.read.outputs.data.brand.lable").suggestion == "label"
    passes(
        step,
        "steps.read.outputs.data.title",
        "steps.read.outputs.data.items",
        "steps.read.outputs.data.items.0.price",
        "steps.read.outputs.data.brand.label",
        # a scalar field is any JSON: no opinion past it
        "steps.read.outputs.data.title.anything",
    )


def test_web_scrape_metadata_discover_and_source() -> None:
    step = scrape(fields={"title": "h1"}, metadata=True)
    step["input"]["discover"] = {"links": {"selector": "a.next"}}
    assert refused(step, "steps.read.outputs.data.metadta.title").suggestion == "metadata"
    assert refused(step, "steps.read.outputs.data.metadata.titel").suggestion == "title"
    assert refused(step, "steps.read.outputs.data.url").suggestion == "urls"
    # source is the worker's declared output, as it was before
    assert refused(step, "steps.read.outputs.source.final_ulr").suggestion == "final_url"
    passes(
        step,
        "steps.read.outputs.data.metadata.canonical_url",
        "steps.read.outputs.data.urls",
        "steps.read.outputs.data.urls.0",
        "steps.read.outputs.source.final_url",
    )
    # without metadata there is none, and without discover no urls
    plain = scrape(fields={"title": "h1"})
    assert refused(plain, "steps.read.outputs.data.metadata").suggestion is None
    assert refused(plain, "steps.read.outputs.data.urls").message.endswith("(it has: title)")
    # discover alone (sitemaps): data holds only urls
    only = {
        "id": "read",
        "worker": "web-scrape",
        "input": {"url": URL, "discover": {"sitemap": True}},
    }
    assert refused(only, "steps.read.outputs.data.ulrs").suggestion == "urls"


def test_web_scrape_stays_open_where_a_reference_or_a_default_decides() -> None:
    by_ref = {
        "id": "read",
        "worker": "web-scrape",
        "input": {"url": URL, "extraction_spec": "${{ inputs.spec }}"},
    }
    passes(by_ref, "steps.read.outputs.data.anything.at.all")
    passes(scrape(fields="${{ inputs.spec }}"), "steps.read.outputs.data.anything")
    # a field given by reference may be a record; one with a default may be anything
    fields = {"rec": "${{ inputs.spec }}", "d": {"selector": "x", "fields": {}, "default": {}}}
    passes(scrape(fields=fields), "steps.read.outputs.data.rec.a", "steps.read.outputs.data.d.b")
    # content or metadata by reference: they may be there
    passes(
        scrape(fields={"t": "h1"}, content="${{ inputs.spec }}", metadata="${{ inputs.spec }}"),
        "steps.read.outputs.data.content.markdown",
        "steps.read.outputs.data.metadata.title",
    )


# --- llm-call -----------------------------------------------------------------------------------

LABEL = {
    "type": "object",
    "required": ["label"],
    "properties": {"label": {"enum": ["positive", "negative"]}, "score": {"type": "number"}},
    "additionalProperties": False,
}


def llm(**extra: Any) -> dict[str, Any]:
    return {"id": "ask", "worker": "llm-call", "input": {"prompt": "hi", **extra}}


def test_llm_call_json_follows_its_response_schema() -> None:
    step = llm(response_schema=LABEL)
    p = refused(step, "steps.ask.outputs.json.lable")
    assert p.message == (
        "steps.ask.outputs.json.lable: the response_schema of step 'ask' has no "
        "outputs.json.lable (it has: label, score)"
    )
    assert p.suggestion == "label"
    assert refused(step, "steps.ask.outputs.txt").suggestion == "text"
    passes(step, "steps.ask.outputs.json.label", "steps.ask.outputs.json", "steps.ask.outputs.text")
    # an open response_schema says nothing of json's keys
    passes(llm(response_schema={"type": "object"}), "steps.ask.outputs.json.anything")
    passes(llm(response_schema="${{ inputs.spec }}"), "steps.ask.outputs.json.anything")


def test_llm_call_without_response_schema_has_no_json_its_reply_is_text() -> None:
    p = refused(llm(), "steps.ask.outputs.json.label")
    assert p.message == (
        "steps.ask.outputs.json.label: llm-call step 'ask' without response_schema "
        "(its reply is text) has no outputs.json (it has: alias, finish_reason, model, "
        "text, tool_calls, usage)"
    )
    # the reply itself is free text: no opinion on what it says
    passes(llm(), "steps.ask.outputs.text", "steps.ask.outputs.usage.output_tokens")


# --- prompt workers -----------------------------------------------------------------------------


def test_a_prompt_workers_outputs_are_its_declared_output_schema() -> None:
    step = {"id": "triage", "worker": "classify-ticket", "input": {"subject": "s", "body": "b"}}
    p = refused(step, "steps.triage.outputs.categroy")
    assert p.message == (
        "steps.triage.outputs.categroy: the output_schema of worker 'classify-ticket' "
        "has no outputs.categroy"
    )
    assert p.suggestion == "category"
    passes(step, "steps.triage.outputs.category", "steps.triage.outputs.summary")


# --- aggregator ---------------------------------------------------------------------------------


def agg(policy: str, branches: Any, **extra: Any) -> dict[str, Any]:
    return {
        "id": "agg",
        "worker": "aggregator",
        "input": {"policy": policy, "branches": branches, **extra},
    }


def test_aggregator_outputs_what_its_policy_returns() -> None:
    merge = agg("merge", {"a": {"x": 1}, "b": {"y": 2}})
    p = refused(merge, "steps.agg.outputs.votes")
    assert "aggregator step 'agg' (policy 'merge') has no outputs.votes" in p.message
    assert refused(merge, "steps.agg.outputs.conflcts").suggestion == "conflicts"
    passes(merge, "steps.agg.outputs.conflicts", "steps.agg.outputs.result.anything")
    vote = agg("majority", ["yes", "yes", "no"])
    assert refused(vote, "steps.agg.outputs.vots").suggestion == "votes"
    passes(vote, "steps.agg.outputs.votes", "steps.agg.outputs.result")
    concat = agg("concat", [[1], [2]])
    passes(concat, "steps.agg.outputs.duplicates_removed", "steps.agg.outputs.result.0")


def test_aggregator_all_keeps_the_branches_names_and_their_shapes() -> None:
    read = scrape(content="article")
    ask = llm(response_schema=LABEL)
    both = agg("all", {"page": "${{ steps.read.outputs.data }}", "label": "${{ steps.ask }}"})
    both["input"]["branches"]["label"] = "${{ steps.ask.outputs.json }}"
    found = problems(read, ask, both, use("steps.agg.outputs.result.pgae"))
    assert [p.suggestion for p in found] == ["page"], [str(p) for p in found]
    assert "the branches of aggregator step 'agg' has no outputs.result.pgae" in found[0].message
    found = problems(read, ask, both, use("steps.agg.outputs.result.page.contnet"))
    assert [p.suggestion for p in found] == ["content"]
    found = problems(read, ask, both, use("steps.agg.outputs.result.label.lable"))
    assert [p.suggestion for p in found] == ["label"]
    ok = use("steps.agg.outputs.result.page.content.markdown")
    assert problems(read, ask, both, ok) == []
    # the policy by reference: the declared output_schema only
    passes(agg("${{ inputs.spec }}", {}), "steps.agg.outputs.votes")


# --- where the outputs are another's -------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"fallback": "llm-call", "fallback_input": {"prompt": "p"}},
        {"on_failure": "escalate"},
        {"for_each": ["a", "b"]},
    ],
)
def test_no_derived_shape_where_another_may_provide_the_outputs(extra: dict[str, Any]) -> None:
    step = {**scrape(content="article"), **extra}
    if "for_each" in extra:
        step["input"]["url"] = "${{ item }}"
    passes(step, "steps.read.outputs.data.anything")


def test_the_pipelines_output_and_when_are_checked_too() -> None:
    step = scrape(content="article")
    (p,) = problems(step, output={"md": "${{ steps.read.outputs.data.contnet.markdown }}"})
    assert (p.step, p.at, p.suggestion) == (None, "output.md", "content")
    when = {"value": "${{ steps.read.outputs.data.content.titel }}", "schema": {}}
    (p,) = problems(step, {**use("steps.read.outputs.source"), "when": when})
    assert (p.at, p.suggestion) == ("when.value", "title")


def test_a_cycle_of_aggregators_is_refused_and_derives_in_bounded_time() -> None:
    # each aggregator's branches name every other: the shapes are derived once each
    n = 60
    steps = [
        agg("all", {f"b{j}": f"${{{{ steps.a{j}.outputs.result }}}}" for j in range(n) if j != i})
        | {"id": f"a{i}"}
        for i in range(n)
    ]
    found = problems(*steps)
    assert found and all("cycle" in p.message for p in found), [str(p) for p in found[:3]]
