"""An external worker in pipelines on the real Temporal dev server.

The worker is ``examples/external/worker.py``, run as its own process by a
``python -c`` that first sets ``sys.modules['aiworker'] = None`` (so any
import of aiworker, direct or indirect, raises) and then runs the file with
runpy: it speaks the protocol with ``temporalio`` and ``jsonschema`` alone.
aiworker's stack loads its spec from ``examples/external/specs``
(``AIWORKER_WORKER_SPECS``), knows it, and never serves it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from conftest import Stack, installed_workers, running_stack
from support.history import workflow_task_failures
from support.pipelines import pipeline_result
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
)
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker as TemporalWorker

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.process.task_queues import all_queues
from aiworker.workers.process.worker_set import load_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "external"
SPECS = EXAMPLE / "specs"
WORKER = "text-stats"
QUEUE = "example-external"
TEXT = "The cat sat on the mat. The dog sat too!"
STATS = {
    "words": 10,
    "sentences": 2,
    "characters": len(TEXT),
    "top_words": [{"word": "the", "count": 3}, {"word": "sat", "count": 2}],
    "reading_seconds": 2.6,
}
# Blocks every import of aiworker in the worker process, then runs the file as a script.
NO_AIWORKER = (
    "import runpy, sys; sys.modules['aiworker'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def with_specs(settings: Settings) -> Settings:
    return settings.model_copy(update={"worker_specs": (SPECS,)})


@asynccontextmanager
async def external_worker(
    client: Client, settings: Settings, tmp_path: Path, *flags: str
) -> AsyncIterator[WorkerProcess]:
    """The example worker in its own process, on this test's queue family."""
    cmd = [
        sys.executable,
        "-c",
        NO_AIWORKER,
        str(EXAMPLE / "worker.py"),
        "--address",
        client.service_client.config.target_host,
        "--namespace",
        client.namespace,
        # `=`: a suffix starts with "-", which argparse would take for an option
        f"--task-queue-suffix={settings.task_queue_suffix}",
        *flags,
    ]
    proc = WorkerProcess(cmd, worker_env(client, settings, tmp_path), tmp_path / "external.log")
    try:
        await wait_until(
            lambda: "polling" in proc.output() or proc.proc.poll() is not None,
            "the external worker to poll",
            timeout=120,  # a new build's first poll may wait out a long poll (~60 s)
        )
        assert proc.proc.poll() is None, proc.output()
        yield proc
        # SIGTERM drains and exits cleanly
        assert proc.terminate() == 0, proc.output()
        assert f"{WORKER}: stopped" in proc.output()
    finally:
        proc.close()


@asynccontextmanager
async def stack_with_specs(client: Client, settings: Settings) -> AsyncIterator[Stack]:
    # entry_points=(): a plugin installed in this venv must not change the set
    with installed_workers(settings, entry_points=()) as ws:
        async with running_stack(client, settings, workers=ws) as stack:
            yield stack


def pipeline(steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "stats", "tenant": "acme", "inputs": {"text": TEXT}, "steps": steps, **extra}


def stats_step(**extra: Any) -> dict[str, Any]:
    return {
        "id": "stats",
        "worker": WORKER,
        "input": {"text": "${{ inputs.text }}", "top": 2},
    } | extra


CHECK_STEP = {
    "id": "check",
    "worker": "validator",
    "depends_on": ["stats"],
    "input": {
        "data": "${{ steps.stats.outputs }}",
        "schema": {"type": "object", "required": ["words", "top_words"]},
    },
}


async def activities(handle: WorkflowHandle[Any, Any]) -> list[tuple[Any, Any]]:
    """Each scheduled activity's attributes and (if it completed) its raw JSON result."""
    history = await handle.fetch_history()
    scheduled: dict[int, Any] = {}
    results: dict[int, Any] = {}
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes
        if e.HasField("activity_task_completed_event_attributes"):
            a = e.activity_task_completed_event_attributes
            results[a.scheduled_event_id] = json.loads(a.result.payloads[0].data)
    return [(a, results.get(i)) for i, a in scheduled.items()]


def reply_encodings(history: Any) -> set[bytes]:
    return {
        e.activity_task_completed_event_attributes.result.payloads[0].metadata["encoding"]
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
    }


async def test_the_spec_is_known_with_its_file_origin_and_not_served(settings: Settings) -> None:
    ws = load_workers(with_specs(settings), entry_points=())
    spec = ws.specs[WORKER]
    assert spec.kind == "external" and spec.task_queue == QUEUE
    assert ws.origin(WORKER) == f"file {SPECS / (WORKER + '.json')}"
    assert WORKER not in ws.served
    assert QUEUE not in all_queues(ws.specs, ws)
    assert "validator" in ws.served  # the built-ins beside it are


async def test_an_external_worker_runs_in_a_pipeline_beside_a_builtin(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    s = with_specs(settings)
    # every first attempt fails with a retryable upstream_error: the spec's retries apply
    async with (
        external_worker(client, s, tmp_path, "--fail-attempts", "1"),
        stack_with_specs(client, s) as stack,
    ):
        handle = await stack.start(
            pipeline(
                [stats_step(timeout_seconds=4), CHECK_STEP],
                output={"words": "${{ steps.stats.outputs.words }}"},
            )
        )
        result: PipelineResult = await handle.result()
        assert result.status == "succeeded", result.steps
        stats = result.steps["stats"]
        assert stats.outputs == STATS and stats.attempts == 2
        assert result.steps["check"].status == "succeeded"
        assert result.steps["check"].outputs["valid"] is True
        assert result.output == {"words": 10}

        calls = [(a, r) for a, r in await activities(handle) if a.activity_type.name == WORKER]
        assert len(calls) == 1
        scheduled, reply = calls[0]
        assert scheduled.task_queue.name == s.queue(QUEUE)
        # both directions are plain JSON: the default converter of every Temporal SDK
        assert scheduled.input.payloads[0].metadata["encoding"] == b"json/plain"
        assert reply_encodings(await handle.fetch_history()) == {b"json/plain"}
        assert scheduled.retry_policy.maximum_attempts == 3
        assert "invalid_input" in scheduled.retry_policy.non_retryable_error_types
        # the step's tighter timeout reached the worker, which reports it
        assert scheduled.start_to_close_timeout.ToTimedelta().total_seconds() == 4 + 5
        assert reply["observability"] == reply["observability"] | {
            "worker_id": WORKER,
            "attempt": 2,
            "timeout_seconds": 4,
        }
        assert reply["observability"]["trace_id"] == result.trace_id

        # an input that fails the worker's input schema: invalid_input, never retried
        bad = await stack.start(pipeline([stats_step(), CHECK_STEP], inputs={"text": 123}))
        result = await pipeline_result(bad)
        stats = result.steps["stats"]
        assert (stats.status, stats.error_code, stats.attempts) == ("failed", "invalid_input", 1)
        assert "123 is not of type 'string'" in (stats.error_message or "")
        assert stats.reasons[0]["path"] == "$.text"
        assert result.steps["check"].status == "skipped"


async def test_the_worker_deadline_is_a_retried_timeout(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    s = with_specs(settings)
    async with (
        external_worker(client, s, tmp_path, "--delay", "2"),
        stack_with_specs(client, s) as stack,
    ):
        handle = await stack.start(
            pipeline([stats_step(timeout_seconds=0.5, retry={"max_attempts": 2}), CHECK_STEP])
        )
        result = await pipeline_result(handle)
    stats = result.steps["stats"]
    assert (stats.status, stats.error_code, stats.attempts) == ("failed", "timeout", 2)
    assert "no result within 0.5s" in (stats.error_message or "")
    assert result.steps["check"].status == "skipped"


async def test_a_malformed_reply_is_invalid_output_and_goes_no_further(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    s = with_specs(settings)
    reasons: dict[str, set[str]] = {}
    for flag, path, message in (
        ("--malformed-envelope", "$.status", "the response envelope is malformed"),
        ("--bad-outputs", "$.words", "the outputs fail the output schema"),
    ):
        async with (
            external_worker(client, s, tmp_path, flag),
            stack_with_specs(client, s) as stack,
        ):
            handle = await stack.start(
                pipeline([stats_step(), CHECK_STEP], output={"n": "${{ steps.stats.outputs }}"})
            )
            result = await pipeline_result(handle)
            scheduled = [a.activity_type.name for a, _ in await activities(handle)]
        stats = result.steps["stats"]
        assert (stats.status, stats.error_code, stats.attempts) == ("failed", "invalid_output", 1)
        assert message in (stats.error_message or ""), flag
        reasons[flag] = {r["path"] for r in stats.reasons}
        assert path in reasons[flag], (flag, stats.reasons)
        assert stats.outputs is None
        # nothing downstream ran: the validator was never called
        assert result.status == "failed" and result.steps["check"].status == "skipped"
        assert scheduled == [WORKER]
    # the envelope's reasons name every missing field; the outputs', each bad one
    assert {"$.status", "$.version", "$.observability"} <= reasons["--malformed-envelope"]
    assert reasons["--bad-outputs"] == {"$", "$.words"}  # missing fields, wrong type


async def test_nobody_polls_the_queue_the_call_fails_at_the_pipeline_deadline(
    client: Client, settings: Settings
) -> None:
    s = with_specs(settings)
    async with stack_with_specs(client, s) as stack:
        handle = await stack.start(
            pipeline([stats_step(), CHECK_STEP], budget={"deadline_seconds": 3})
        )
        seen: dict[str, Any] = {}

        async def waiting() -> bool:
            progress = await handle.query(names.PROGRESS_QUERY)
            seen.update(progress["steps"].get("stats", {}).get("external_worker") or {})
            return bool(seen)

        # the call is scheduled within a workflow task
        await wait_until(waiting, "the external call's stats in progress", timeout=4, interval=0.02)
        result = await pipeline_result(handle)

    queue = s.queue(QUEUE)
    assert seen["task_queue"] == queue
    assert 0 < seen["schedule_to_start_timeout_seconds"] <= 3
    assert seen["schedule_to_start_deadline"] is not None
    assert "cannot see whether a worker has picked the call up" in seen["note"]

    stats = result.steps["stats"]
    assert (stats.status, stats.error_code, stats.attempts) == ("failed", "timeout", 0)
    assert f"no worker polled task queue {queue!r}" in (stats.error_message or "")
    assert result.status == "failed" and result.steps["check"].status == "skipped"
    [(call, reply)] = await activities(handle)
    assert reply is None and call.task_queue.name == queue
    # bounded by what was left of the deadline, not by the spec's timeout or retries
    wait = call.schedule_to_start_timeout.ToTimedelta().total_seconds()
    assert 0 < wait <= 3
    assert abs(seen["schedule_to_start_timeout_seconds"] - wait) < 0.001


async def test_the_external_worker_passes_the_conformance_kit(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    from aiworker.workers.conformance.run import check_worker

    spec = load_workers(with_specs(settings), entry_points=()).specs[WORKER]
    async with external_worker(client, settings, tmp_path):
        report = await check_worker(client, spec, queue_suffix=settings.task_queue_suffix)
    assert report.passed, report.render()
    ran = {c.name.split(" ")[0]: c.status for c in report.checks}
    # every check ran (the example is offline): none was skipped
    assert set(ran.values()) == {"pass"}, report.render()
    assert {"tightened", "invalid", "wrong", "error"} <= set(ran), report.render()


async def test_a_misbehaving_external_worker_fails_the_conformance_kit(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    from aiworker.workers.conformance.run import check_worker

    spec = load_workers(with_specs(settings), entry_points=()).specs[WORKER]
    async with external_worker(client, settings, tmp_path, "--malformed-envelope"):
        report = await check_worker(
            client, spec, queue_suffix=settings.task_queue_suffix, call_timeout=30
        )
    assert not report.passed
    failed = [c for c in report.checks if c.status == "fail"]
    assert any(c.name.startswith("example[") for c in failed), report.render()


@asynccontextmanager
async def stand_in(client: Client, settings: Settings, fn: Any) -> AsyncIterator[None]:
    """A same-name activity on the external worker's queue (STYLE: a workflow test may
    stand in for a worker): here, an external worker that fails in ways aiworker never
    wrote, which the workflow must turn into a stable code, never a stuck task."""
    worker = TemporalWorker(
        client,
        task_queue=settings.queue(QUEUE),
        activities=[activity.defn(name=WORKER)(fn)],
    )
    async with worker:
        yield


async def test_a_failure_aiworker_never_wrote_is_internal_with_its_type_named(
    client: Client, settings: Settings
) -> None:
    async def foreign_type_bad_details(request: dict[str, Any]) -> dict[str, Any]:
        # a type outside the code table, and details that are no ErrorInfo
        raise ApplicationError(
            "boom",
            {"context": "x", "reasons": "oops", "usage": 5},
            type="KeyError",
            non_retryable=True,
        )

    async def plain_exception(request: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("nope")  # what an SDK sends for an uncaught exception

    s = with_specs(settings)
    cases = (
        (foreign_type_bad_details, "KeyError", 1, "its ErrorInfo detail is malformed and ignored"),
        (plain_exception, "ValueError", 3, "nope"),  # retryable: the spec's 3 attempts
    )
    for fn, foreign, attempts, said in cases:
        async with stand_in(client, s, fn), stack_with_specs(client, s) as stack:
            handle = await stack.start(pipeline([stats_step(), CHECK_STEP]))
            # bounded: before the fix, the pipeline itself failed as internal
            result = await asyncio.wait_for(pipeline_result(handle), 60)
        # the step failed, not the pipeline: its failure is routed like any other
        stats = result.steps["stats"]
        assert (stats.status, stats.error_code, stats.attempts) == ("failed", "internal", attempts)
        assert f"failed with type {foreign!r}, which is no aiworker error code" in (
            stats.error_message or ""
        )
        assert said in (stats.error_message or "")
        assert stats.reasons == []
        assert result.status == "failed" and result.steps["check"].status == "skipped"


class Odd:
    """A value only the stand-in's own converter can encode (``binary/x-odd``)."""


class OddEncoding(EncodingPayloadConverter):
    """An encoding aiworker's converter does not know, as a foreign SDK might write."""

    @property
    def encoding(self) -> str:
        return "binary/x-odd"

    def to_payload(self, value: Any) -> Payload | None:
        return (
            Payload(metadata={"encoding": b"binary/x-odd"}, data=b"odd")
            if isinstance(value, Odd)
            else None
        )

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        return Odd()


class OddPayloadConverter(CompositePayloadConverter):
    def __init__(self) -> None:
        super().__init__(
            OddEncoding(), *DefaultPayloadConverter.default_encoding_payload_converters
        )


async def test_failure_details_in_an_unknown_encoding_are_dropped_and_the_step_fails(
    client: Client, settings: Settings
) -> None:
    async def odd_details(request: dict[str, Any]) -> dict[str, Any]:
        # a cause chain whose every level carries a detail aiworker cannot decode
        raise ApplicationError("boom", Odd(), type="upstream_error") from ApplicationError(
            "provider said no", Odd()
        )

    # the stand-in's own client writes its failures with the odd encoding
    foreign = Client(
        **{
            **client.config(),
            "data_converter": DataConverter(payload_converter_class=OddPayloadConverter),
        }
    )
    s = with_specs(settings)
    async with stand_in(foreign, s, odd_details), stack_with_specs(client, s) as stack:
        handle = await stack.start(pipeline([stats_step(), CHECK_STEP]))
        # bounded: before the fix, every workflow task failed decoding the failure, forever
        result = await asyncio.wait_for(pipeline_result(handle), 60)
    assert await workflow_task_failures(handle) == 0
    stats = result.steps["stats"]
    # upstream_error is retryable: the spec's 3 attempts ran, the last one's failure ends the step
    assert (stats.status, stats.error_code, stats.attempts) == ("failed", "upstream_error", 3)
    # the message without its code (the step's error_code says it once)
    assert stats.error_message == (
        "boom (details dropped: cannot decode: Unknown payload encoding binary/x-odd)"
    )
    assert result.status == "failed" and result.steps["check"].status == "skipped"
