"""The worker runtime through a real Temporal server: contracts, constraints,
error mapping, retries as the spec says, and the log line."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from support import history
from support.harness import CallWorkerWorkflow
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from aiworker.activities.errors import FetchFailedError, RateLimitedError
from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import WorkerResponse
from aiworker.schemas.spec import WorkerSpec

SPEC = {
    "worker_id": "echo",
    "version": "1",
    "purpose": "test worker",
    "task_queue": "test",
    "input_schema": {
        "type": "object",
        "required": ["mode"],
        "properties": {"mode": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
        "additionalProperties": False,
    },
    "output_schema": {
        "type": "object",
        "required": ["echo"],
        "properties": {"echo": {"type": "string"}},
    },
    "constraints": {
        "timeout_seconds": 2,
        "max_tokens": 100,
        "tools_allowed": ["fetch_url"],
        "max_external_calls": 2,
    },
    "retries": {
        "max_attempts": 3,
        "backoff": "exponential",
        "initial_interval_ms": 50,
        "max_interval_ms": 200,
    },
}


class Echo:
    """A worker whose behaviour the input picks."""

    worker_id: ClassVar[str] = "echo"
    calls: ClassVar[int] = 0

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        mode = input["mode"]
        Echo.calls += 1
        if mode == "ok":
            return WorkerResult(outputs={"echo": "ok"})
        if mode == "bad-output":
            return WorkerResult(outputs={"echo": 42})
        if mode == "flaky":
            if ctx.attempt < 3:
                raise FetchFailedError("upstream 503", status_code=503)
            return WorkerResult(outputs={"echo": f"attempt {ctx.attempt}"})
        if mode == "always-5xx":
            raise FetchFailedError("upstream 503", status_code=503)
        if mode == "rate-limited":
            if ctx.attempt == 1:
                raise RateLimitedError("slow down", retry_after=0.3)
            return WorkerResult(outputs={"echo": "after wait"})
        if mode == "slow":
            await asyncio.sleep(30)
        if mode == "bug":
            raise KeyError("missing-thing")
        if mode == "tool":
            ctx.tools.use("parse_html")
        if mode == "calls":
            for _ in range(input.get("n", 0)):
                ctx.tools.use("fetch_url")
            return WorkerResult(outputs={"echo": f"{ctx.tools.external_calls} calls"})
        return WorkerResult(outputs={"echo": mode})


class EchoActivities:
    def __init__(self, runtime: WorkerRuntime) -> None:
        self._runtime = runtime

    @activity.defn(name="echo")
    async def echo(self, request: dict[str, Any]) -> WorkerResponse:
        return await self._runtime.run(Echo(), request)


@pytest.fixture
async def queue(client: Client, settings: Settings) -> AsyncIterator[str]:
    spec = WorkerSpec.model_validate(SPEC)
    runtime = WorkerRuntime(
        settings, {"echo": spec}, tools={"fetch_url": object(), "parse_html": object()}
    )
    tq = f"runtime-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=tq,
        workflows=[CallWorkerWorkflow],
        activities=[EchoActivities(runtime).echo],
        interceptors=[runtime.interceptor()],
    ):
        yield tq


def request(mode: Any, **extra: Any) -> dict[str, Any]:
    req = {
        "worker_id": "echo",
        "version": "1",
        "idempotency_key": f"k/{uuid.uuid4().hex}",
        "tenant": "acme",
        "input": {"mode": mode},
    }
    req.update(extra)
    return req


async def call(client: Client, queue: str, req: dict[str, Any]) -> Any:
    return await client.start_workflow(
        CallWorkerWorkflow.run,
        {"spec": SPEC, "request": req, "task_queue": queue},
        id=f"call-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )


async def failure_of(handle: Any) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as ei:
        await handle.result()
    cause = ei.value.cause
    assert isinstance(cause, ActivityError)
    assert isinstance(cause.cause, ApplicationError)
    return cause.cause


async def test_success_returns_validated_response(client: Client, queue: str) -> None:
    h = await call(client, queue, request("ok"))
    resp = await h.result()
    assert resp.status == "succeeded"
    assert resp.outputs == {"echo": "ok"}
    assert resp.observability.attempt == 1
    assert resp.observability.worker_id == "echo"
    assert resp.observability.duration_ms > 0


async def test_invalid_input_fails_once_naming_field_and_rule(client: Client, queue: str) -> None:
    h = await call(client, queue, request(123))
    err = await failure_of(h)
    assert err.type == "invalid_input"
    assert err.non_retryable
    assert "input $.mode" in err.message and "rule type" in err.message
    assert err.details[0]["field"] == "input.mode"
    assert await history.last_activity_attempt(h) == 1


async def test_malformed_envelope_is_invalid_input(client: Client, queue: str) -> None:
    req = request("ok")
    del req["idempotency_key"]
    h = await call(client, queue, req)
    err = await failure_of(h)
    assert err.type == "invalid_input"
    assert "idempotency_key" in err.message
    assert await history.last_activity_attempt(h) == 1


async def test_invalid_output_is_never_passed_on(client: Client, queue: str) -> None:
    h = await call(client, queue, request("bad-output"))
    err = await failure_of(h)
    assert err.type == "invalid_output"
    assert err.details[0]["field"] == "outputs.echo"
    assert await history.last_activity_attempt(h) == 1


async def test_retryable_failure_retried_exactly_as_spec_says(client: Client, queue: str) -> None:
    h = await call(client, queue, request("always-5xx"))
    err = await failure_of(h)
    assert err.type == "fetch_failed"
    assert not err.non_retryable
    assert await history.last_activity_attempt(h) == 3
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in await history.events(h)
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    policy = scheduled[0].retry_policy
    assert policy.maximum_attempts == 3
    assert policy.backoff_coefficient == 2.0
    assert policy.initial_interval.ToMilliseconds() == 50
    assert "invalid_input" in policy.non_retryable_error_types


async def test_flaky_worker_succeeds_on_third_attempt(client: Client, queue: str) -> None:
    h = await call(client, queue, request("flaky"))
    resp = await h.result()
    assert resp.outputs == {"echo": "attempt 3"}
    assert resp.observability.attempt == 3


async def test_rate_limited_retry_uses_retry_after(client: Client, queue: str) -> None:
    h = await call(client, queue, request("rate-limited"))
    resp = await h.result()
    assert resp.observability.attempt == 2
    assert resp.outputs == {"echo": "after wait"}


async def test_loosening_constraint_is_invalid_input(client: Client, queue: str) -> None:
    for loosened in (
        {"timeout_seconds": 10},
        {"max_tokens": 1000},
        {"tools_allowed": ["fetch_url", "http_post"]},
        {"max_external_calls": 3},
    ):
        h = await call(client, queue, request("ok", constraints=loosened))
        err = await failure_of(h)
        assert err.type == "invalid_input", loosened
        assert err.details[0]["field"] == f"constraints.{next(iter(loosened))}"
        assert await history.last_activity_attempt(h) == 1


async def test_tightened_deadline_ends_in_timeout(client: Client, queue: str) -> None:
    req = request("slow", constraints={"timeout_seconds": 0.3})
    h = await call(client, queue, req)
    err = await failure_of(h)
    assert err.type == "timeout"
    assert "0.3s" in err.message


async def test_tool_outside_allow_list(client: Client, queue: str) -> None:
    err = await failure_of(await call(client, queue, request("tool")))
    assert err.type == "tool_not_allowed"
    assert err.non_retryable


async def test_external_call_quota(client: Client, queue: str) -> None:
    h = await call(client, queue, {**request("calls"), "input": {"mode": "calls", "n": 2}})
    resp = await h.result()
    assert resp.usage.external_calls == 2
    h = await call(
        client,
        queue,
        {
            **request("calls"),
            "input": {"mode": "calls", "n": 2},
            "constraints": {"max_external_calls": 1},
        },
    )
    err = await failure_of(h)
    assert err.type == "budget_exceeded"


async def test_bug_is_internal_with_traceback_logged(
    client: Client, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiworker.worker")
    req = request("bug")
    h = await call(client, queue, req)
    err = await failure_of(h)
    assert err.type == "internal"
    assert "KeyError" in err.message
    records = [
        r for r in caplog.records if getattr(r, "aiworker", {}).get("error_code") == "internal"
    ]
    assert records, "the failure was not logged"
    fields = records[-1].aiworker  # type: ignore[attr-defined]
    assert "Traceback" in fields["traceback"]
    assert fields["idempotency_key"] == req["idempotency_key"]
    assert fields["tenant"] == "acme"
    json.dumps(fields, default=str)
