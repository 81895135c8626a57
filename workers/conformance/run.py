"""The conformance kit: check a live worker against its spec, through Temporal.

``aiworker conformance WORKER_ID`` and :func:`check_worker` (one line in a
test) send requests to a worker that some worker process serves, exactly as a
pipeline would: by activity name on the spec's task queue (plus the
deployment's ``AIWORKER_TASK_QUEUE_SUFFIX``), with the activity options
derived from the spec. The calls run in :class:`ConformanceWorkflow`, on a
private task queue served by a temporary ``temporalio.worker.Worker`` in this
process; the outcomes come back raw and are judged here, in plain Python:

1. ``example[i]``: each spec example returns a valid ``WorkerResponse``
   envelope (``observability``, ``usage`` and all) for this worker, whose
   ``outputs`` are valid against ``output_schema``. Examples marked
   ``network``, and all examples of a worker with ``side_effects``, run only
   when asked (``--network``, ``--side-effects``); otherwise they are skipped
   with the reason.
2. ``invalid input``: an input derived to break ``input_schema`` (a missing
   required property, a wrong type, an undeclared property of a closed
   object) fails exactly once, non-retryable, as ``invalid_input``.
3. ``error info``: every failure carries an ``ErrorInfo`` in ``details[0]``
   whose ``code`` is a stable code equal to the failure's type.
4. ``tightened timeout``: a request with a lower ``constraints.timeout_seconds``
   gets a response whose ``observability.timeout_seconds`` is that value (the
   deadline reached the worker; an external worker must echo it).
5. ``wrong version``: a request for another contract major version is refused
   as ``invalid_input``, once.

Attempt counts come from the workflow's history (the ``ActivityTaskStarted``
event of each call), not from what the worker says about itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle

from aiworker.config.catalog import current_specs
from aiworker.schemas.protocol import (
    RequestConstraints,
    TraceContext,
    WorkerRequest,
)
from aiworker.schemas.spec import SpecExample, WorkerSpec, describe_validation, read_json_file
from aiworker.workers.conformance.checks import (
    _INVALID_ID,
    _TIMEOUT_ID,
    _VERSION_ID,
    DEFAULT_CALL_TIMEOUT,
    ConformanceReport,
    _example_name,
    _judge,
    invalid_inputs,
    other_major,
    tightened_timeout,
)
from aiworker.workflows.conformance import ConformanceCall, ConformancePlan, ConformanceWorkflow


def examples_for(spec: WorkerSpec, raw: Any, where: str) -> list[SpecExample]:
    """``raw`` (a JSON list like a spec's ``examples``) checked as examples of ``spec``.

    ``ValueError`` names ``where`` and the field (an input that breaks
    ``input_schema``, a prompt worker's example not marked ``network``).
    """
    try:
        checked = WorkerSpec.model_validate({**spec.model_dump(mode="json"), "examples": raw})
    except ValidationError as e:
        raise ValueError(f"{where}: {describe_validation(e)}") from None
    return checked.examples


def load_examples(spec: WorkerSpec, path: str | Path) -> list[SpecExample]:
    """Examples from a JSON file (a list like a spec's ``examples``) for ``spec``."""
    p = Path(path)
    return examples_for(spec, read_json_file(p), str(p))


def _request(
    spec: WorkerSpec,
    run: str,
    call_id: str,
    worker_input: dict[str, Any],
    *,
    tenant: str,
    version: str | None = None,
    timeout_seconds: float | None = None,
    key_of: str | None = None,
) -> dict[str, Any]:
    trace = TraceContext(trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16])
    return WorkerRequest(
        worker_id=spec.worker_id,
        version=version or spec.version,
        idempotency_key=f"conformance/{run}/{key_of or call_id}",
        step_id=call_id,
        tenant=tenant,
        trace=trace,
        input=worker_input,
        constraints=RequestConstraints(timeout_seconds=timeout_seconds),
    ).model_dump(mode="json", exclude_none=True)


def checkable_spec(specs: Mapping[str, WorkerSpec], worker_id: str) -> WorkerSpec:
    """``worker_id``'s spec, when the kit can check that worker.

    The kit speaks the activity protocol (request and response envelopes, error
    codes on failures); a ``workflow`` worker (``llm-agent``) is no activity: its
    step runs as a child workflow whose turns and tool calls are the checked
    activities, and its input is checked by ``aiworker check`` and at workflow start.

    Raises:
        KeyError: no worker ``worker_id`` in ``specs``.
        ValueError: the worker is no activity.
    """
    spec = specs.get(worker_id)
    if spec is None:
        raise KeyError(f"unknown worker {worker_id!r}; known: {', '.join(sorted(specs))}")
    if spec.implementation.kind == "workflow":
        raise ValueError(
            f"{worker_id!r} runs as a child workflow of its pipeline step, not as an "
            "activity: the conformance kit checks activity workers; check its turns' worker "
            "(llm-call) and its tools instead"
        )
    return spec


async def check_worker(
    client: Client,
    spec: WorkerSpec | str,
    *,
    queue_suffix: str = "",
    network: bool = False,
    side_effects: bool = False,
    examples: list[SpecExample] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    tenant: str = "default",
) -> ConformanceReport:
    """Run the conformance checks against the live worker ``spec`` names.

    Some worker process must serve the worker on its spec's task queue (with
    ``queue_suffix``) on the server ``client`` talks to; this function serves
    only its own workflow, on a private queue, for the duration of the call.
    In a test::

        report = await check_worker(client, "word-count", queue_suffix=suffix)
        assert report.passed, report.render()

    Args:
        client: a client of the namespace the worker process polls in.
        spec: the worker's spec, or its id in this process's catalog.
        queue_suffix: the deployment's ``AIWORKER_TASK_QUEUE_SUFFIX``.
        network: also run examples marked ``network`` (they reach a site or a model).
        side_effects: also run the examples of a worker with ``side_effects``.
        examples: run these instead of the spec's ``examples`` (see :func:`examples_for`).
        call_timeout: seconds each call may take, retries included, before it counts
            as unanswered (nobody polls the queue, or the worker hangs).
        tenant: the tenant of every request.

    Returns:
        The report; ``report.passed`` unless a check failed.

    Raises:
        KeyError: ``spec`` names no worker of this process.
        ValueError: the worker is no activity (:func:`checkable_spec`).
    """
    from temporalio.worker import Worker as TemporalWorker

    from aiworker.workers.process.plugin import workflow_runner

    spec = checkable_spec(
        current_specs() if isinstance(spec, str) else {spec.worker_id: spec},
        spec if isinstance(spec, str) else spec.worker_id,
    )
    if examples is not None:
        spec = spec.model_copy(update={"examples": examples})
    report = ConformanceReport(spec.worker_id, spec.version, spec.task_queue + queue_suffix)
    run = uuid.uuid4().hex[:12]
    calls, skipped = _plan(spec, run, tenant=tenant, network=network, side_effects=side_effects)
    plan = ConformancePlan(
        spec=spec.model_dump(mode="json"),
        queue_suffix=queue_suffix,
        call_timeout_seconds=call_timeout,
        calls=calls,
    )
    queue = f"aiworker-conformance-{run}"
    workflow_id = f"conformance-{spec.worker_id}-{run}"
    report.workflow_id = workflow_id
    async with TemporalWorker(
        client, task_queue=queue, workflows=[ConformanceWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            ConformanceWorkflow.run,
            plan.model_dump(mode="json"),
            id=workflow_id,
            task_queue=queue,
            # every call bounded by `call_timeout`; the margin covers the workflow tasks
            execution_timeout=timedelta(seconds=call_timeout * len(calls) + 60),
        )
        result = await handle.result()
        attempts = await _attempts(handle)
    outcomes = {o["id"]: {**o, "attempts": attempts.get(o["id"], 0)} for o in result["calls"]}
    report.checks = _judge(spec, calls, outcomes, skipped, report.task_queue, call_timeout)
    return report


def _plan(
    spec: WorkerSpec, run: str, *, tenant: str, network: bool, side_effects: bool
) -> tuple[list[ConformanceCall], dict[str, str]]:
    """The calls to make, and the examples skipped (by check name) with the reason."""
    calls: list[ConformanceCall] = []
    skipped: dict[str, str] = {}
    runnable: list[tuple[int, SpecExample]] = []
    for i, ex in enumerate(spec.examples):
        name = _example_name(i, ex)
        if spec.side_effects and not side_effects:
            skipped[name] = "the worker has side_effects: run with --side-effects (or --all)"
        elif ex.network and not network:
            skipped[name] = "the example needs the network: run with --network (or --all)"
        else:
            runnable.append((i, ex))
            cid = f"example-{i}"
            calls.append(
                ConformanceCall(
                    id=cid, request=_request(spec, run, cid, dict(ex.input), tenant=tenant)
                )
            )
    if runnable:
        t = tightened_timeout(spec)
        first, example = runnable[0]
        calls.append(
            ConformanceCall(
                id=_TIMEOUT_ID,
                request=_request(
                    spec,
                    run,
                    _TIMEOUT_ID,
                    dict(example.input),
                    tenant=tenant,
                    timeout_seconds=t,
                    # the example's own key: a worker with side effects does them once
                    key_of=f"example-{first}" if spec.side_effects else None,
                ),
                timeout_seconds=t,
            )
        )
    bad = invalid_inputs(spec)
    if bad:
        calls.append(
            ConformanceCall(
                id=_INVALID_ID, request=_request(spec, run, _INVALID_ID, bad[0][0], tenant=tenant)
            )
        )
    base = dict(spec.examples[0].input) if spec.examples else {}
    calls.append(
        ConformanceCall(
            id=_VERSION_ID,
            request=_request(
                spec, run, _VERSION_ID, base, tenant=tenant, version=other_major(spec.version)
            ),
        )
    )
    return calls, skipped


async def _attempts(handle: WorkflowHandle[ConformanceWorkflow, dict[str, Any]]) -> dict[str, int]:
    """How many attempts each call took, from the history (by activity id)."""
    scheduled: dict[int, str] = {}
    out: dict[str, int] = {}
    history = await handle.fetch_history()
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_id
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            if a.scheduled_event_id in scheduled:
                out[scheduled[a.scheduled_event_id]] = a.attempt
    return out
