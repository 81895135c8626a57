"""Failures that name their cause, through a real Temporal server: the result's
``error`` (the failing step, its code, message and cause chain), the causes a
fallback and a validation loop keep, gate messages, attempts counted as they
happen, and one log line per failed attempt."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from conftest import running_stack
from support.loopback import Exchange, serve
from support.pipelines import pipeline_result
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings
from aiworker.schemas import names

PAGE_SPEC = {"fields": {"title": {"selector": "h1", "required": True}}}


def _site(ex: Exchange) -> None:
    ex.send(404, b"gone")


async def test_a_404_names_the_failing_step_and_an_output_problem_is_only_a_warning(
    client: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    tools = scrape_tools(settings)
    try:
        with serve(_site) as site:
            pipeline = {
                "name": "gone",
                "steps": [
                    {
                        "id": "scrape",
                        "worker": "web-scrape",
                        "input": {"url": site.url("/missing.html"), "extraction_spec": PAGE_SPEC},
                    },
                    {
                        "id": "check",
                        "worker": "validator",
                        "input": {"data": "${{ steps.scrape.outputs.data }}", "schema": {}},
                    },
                ],
                # refers to a step that never ran: before, this hid the 404
                "output": {"valid": "${{ steps.check.outputs.valid }}"},
            }
            async with running_stack(client, settings, tools=tools) as stack:
                handle = await stack.start(pipeline)
                result = await pipeline_result(handle)
    finally:
        await tools["fetch_url"].aclose()
    assert result.status == "failed"
    error = result.error
    assert error is not None
    assert (error.code, error.step) == ("not_found", "scrape")
    assert "404" in error.message and "missing.html" in error.message
    (cause,) = error.cause
    assert (cause.code, cause.worker, cause.attempt) == ("not_found", "web-scrape", 1)
    (warning,) = result.warnings
    assert (warning["code"], warning["field"]) == ("output_incomplete", "output.valid")
    assert result.steps["check"].status == "skipped"

    # one line per failed attempt: the runtime's, not the SDK's again
    lines = [getattr(r, "aiworker", {}) for r in caplog.records]
    mine = [line for line in lines if line.get("event") == "worker_call"]
    assert [line.get("error_code") for line in mine] == ["not_found"]
    sdk = [r for r in caplog.records if "Completing activity as failed" in r.getMessage()]
    assert sdk == []


async def test_a_failed_fallback_keeps_the_primary_cause(
    client: Client, settings: Settings
) -> None:
    async def primary(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("invalid_input", "unknown model alias 'gpt5' (implementation.model)")

    async def backup(req: dict[str, Any]) -> dict[str, Any]:
        return {"published": True, "duplicate": False, "idempotency_key": "k", "sink": "s"}

    pipeline = {
        "name": "fb-fails",
        "steps": [
            {
                "id": "ask",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "fallback": "publish",
                "fallback_input": {"sink": {"file": "fb.jsonl"}, "record": {}},
                "validate": {"schema": {"required": ["answer"]}},
            }
        ],
    }
    acts = {"aggregator": standin("aggregator", primary), "publish": standin("publish", backup)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        result = await pipeline_result(await stack.start(pipeline))
    ask = result.steps["ask"]
    assert result.status == "failed" and ask.fallback_used
    error = result.error
    assert error is not None and (error.code, error.step) == ("validation_failed", "ask")
    # one line naming both: the fallback's failure and the primary's before it
    assert (
        "fallback 'publish' failed: its output failed validation: "
        "$: missing required key 'answer'" in error.message
    )
    assert "before it, 'aggregator' failed: invalid_input: unknown model alias 'gpt5'" in (
        error.message
    )
    fallback, first = error.cause
    assert (fallback.code, fallback.worker, fallback.fallback) == (
        "validation_failed",
        "publish",
        True,
    )
    assert fallback.reasons[0]["validator"] == "required"
    assert (first.code, first.worker, first.attempt) == ("invalid_input", "aggregator", 1)
    assert "gpt5" in first.message
    # the step keeps the fallback's rejected output as best effort; the error stays small
    assert ask.cause[0].outputs["published"] is True
    assert fallback.outputs is None


async def test_a_failed_validation_loop_counts_attempts_and_keeps_each_output(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []
    second_call = asyncio.Event()
    seen = asyncio.Event()

    async def producer(req: dict[str, Any]) -> dict[str, Any]:
        n = len(calls)
        if n == 2:
            second_call.set()
            await asyncio.wait_for(seen.wait(), 30)  # until the test saw progress
        return {"policy": "all", "result": {"title": "", "draft": n}, "used": [], "failed": []}

    schema = {"properties": {"result": {"properties": {"title": {"minLength": 1}}}}}
    pipeline = {
        "name": "loop-fails",
        "steps": [
            {
                "id": "make",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "validate": {"schema": schema, "max_attempts": 3},
            }
        ],
    }
    acts = {"aggregator": standin("aggregator", producer, calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        await asyncio.wait_for(second_call.wait(), 30)

        async def counted() -> dict[str, Any] | None:
            step: dict[str, Any] = (await handle.query(names.PROGRESS_QUERY))["steps"]["make"]
            return step if step["attempts"] == 2 else None

        try:
            make = await wait_until(counted, "progress to count the second attempt")
        finally:
            seen.set()
        result = await pipeline_result(handle)
    # during the loop: the running call counts, and the validation that rejected the first
    assert make["status"] == "running" and make["validation_attempts"] == 1
    assert make["cause"][0]["code"] == "validation_failed"
    assert "outputs" not in make and "outputs" not in make["cause"][0]  # only when asked

    step = result.steps["make"]
    assert (step.status, step.error_code, step.attempts, step.validation_attempts) == (
        "failed",
        "validation_failed",
        3,
        3,
    )
    assert step.error_message is not None
    assert step.error_message.startswith("validation attempt 3 of 3 failed: $.result.title: ")
    # every try's cause and rejected output, newest first
    assert [c.attempt for c in step.cause] == [3, 2, 1]
    assert [c.outputs["result"]["draft"] for c in step.cause] == [3, 2, 1]
    assert all(c.reasons[0]["path"] == "$.result.title" for c in step.cause)
    error = result.error
    assert error is not None and (error.code, error.step) == ("validation_failed", "make")
    assert error.cause[0].reasons[0]["path"] == "$.result.title"


async def test_a_gate_says_what_its_validator_said(client: Client, settings: Settings) -> None:
    pipeline = {
        "name": "gate-says",
        "inputs": {"product": {"title": ""}},
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {
                    "data": "${{ inputs.product }}",
                    "schema": {"properties": {"title": {"minLength": 1}}},
                },
            },
            {
                "id": "notify",
                "worker": "publish",
                "gate": "check",
                "input": {"sink": {"file": "g.jsonl"}, "record": "${{ inputs.product }}"},
            },
        ],
    }
    async with running_stack(client, settings) as stack:
        result = await pipeline_result(await stack.start(pipeline))
    notify = result.steps["notify"]
    assert notify.status == "blocked"
    assert notify.error_message is not None
    assert notify.error_message.startswith(
        "gate 'check' did not pass: its validator said valid: false: $.title: "
    )
    assert "(succeeded)" not in notify.error_message
    error = result.error
    assert result.status == "partial" and error is not None
    assert (error.code, error.step) == ("validation_failed", "notify")
    assert (error.cause[0].step, error.cause[0].reasons[0]["path"]) == ("check", "$.title")


async def test_a_failed_attempt_is_logged_once(
    client: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def broken(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("access_denied", "robots.txt disallows /private")

    step = {"id": "s", "worker": "aggregator", "input": {"policy": "all", "branches": {}}}
    acts = {"aggregator": standin("aggregator", broken)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        result = await pipeline_result(await stack.start({"name": "logged-once", "steps": [step]}))
    assert result.error is not None and result.error.code == "access_denied"
    # the run itself fails with the step's failure: the SDK's one debug line about
    # the workflow ("Workflow raised failure") is the run's, not the attempt's again
    failed = [
        r
        for r in caplog.records
        if "robots.txt disallows" in str(r.exc_info)
        and not r.getMessage().startswith("Workflow raised failure")
    ]
    lines = [getattr(r, "aiworker", {}) for r in caplog.records]
    calls = [line for line in lines if line.get("event") == "worker_call"]
    assert [line.get("error_code") for line in calls] == ["access_denied"]
    # the SDK's "Completing activity as failed" repeats it with a traceback: dropped
    assert failed == []
    assert not [r for r in caplog.records if "Completing activity as failed" in r.getMessage()]
