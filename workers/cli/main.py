"""The ``aiworker`` command line: one function per command.

aiworker dev                 embedded Temporal server + UI + a worker
aiworker demo [--exit]       dev stack, run the sample pipeline, print a table of its steps
aiworker worker [-q QUEUE]   a worker process polling task queues
aiworker run FILE|-          start a pipeline, show its progress and a summary (--json: the result)
aiworker check FILE|-        check a pipeline without running it (exit 0 valid, 2 invalid)
aiworker review ID DECISION  approve|reject|retry an escalated step (Workflow Update)
aiworker callback TOKEN      complete, fail or extend a wait step's token (Workflow Update)
aiworker list [--status S]   pipelines by status, tenant, name (visibility query)
aiworker redrive ID          run a failed pipeline again, reusing its succeeded steps
aiworker workers             the live workers and the processes serving them (offline: the specs)
aiworker artifacts WF_ID     list the artifacts a workflow wrote (lineage)
aiworker items WF_ID STEP    a for_each step's items as JSON Lines (inline or by reference)
aiworker schemas export|check  write or check schemas/json/
aiworker replay [FILES] [--query Q]  the replay gate: recorded histories against this code
aiworker conformance WORKER_ID  check a live worker against its spec through Temporal
aiworker eval dataset|run|show  evals from recorded calls: a dataset, a candidate run, a CI gate
aiworker serve               the HTTP front door (start, status, result, review, webhooks)
aiworker keys add NAME       a new API key for the front door, stored hashed

The grammar is :mod:`aiworker.workers.cli.parser`; pipelines are reached
through :class:`aiworker.workers.client.client.PipelineClient`, processes run by
:mod:`aiworker.workers.devstack.supervisor`. Heavy modules load inside the command that
needs them, so ``aiworker workers`` does not pay for a Temporal client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from aiworker.workers.cli.bulk import cmd_cancel, cmd_terminate
from aiworker.workers.cli.command_span import command_span
from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    check_pipeline_file,
    checked_pipeline,
    cli_span,
    command_client,
    command_settings,
    command_view,
    configure_logs,
    dev_settings,
    err,
    load_pipeline_file,
    load_settings,
    local_view,
    no_answer,
    outcome_code,
    pipelines_session,
    process_catalog,
    read_pipeline,
    start_worker_process,
)
from aiworker.workers.cli.deployment_commands import cmd_deployment
from aiworker.workers.cli.eval_commands import cmd_eval
from aiworker.workers.cli.items import cmd_items
from aiworker.workers.cli.parser import build_parser
from aiworker.workers.cli.schedule_commands import cmd_schedule
from aiworker.workers.cli.serve import cmd_keys, cmd_serve
from aiworker.workers.client.terminal import safe_text
from aiworker.workers.process.replay import cmd_replay

if TYPE_CHECKING:
    from aiworker.config.settings import Settings
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.workers.client.client import PipelineClient, PipelineHandle
    from aiworker.workers.client.pollers import Kind, QueueService
    from aiworker.workers.devstack.supervisor import DevOptions
    from aiworker.workers.process.live_registry import LiveRegistry


async def cmd_run(args: argparse.Namespace) -> int:
    """``aiworker run FILE|-``: start a pipeline, then print its id or its outcome.

    One connection and one check: the pipeline is checked here against the live
    registry read through the command's own connection (the run checks it once more
    in its run-config activity, which is what a start by the ``temporal`` CLI
    relies on); with Temporal unreachable it is checked against the local specs,
    so a broken file still says what is wrong (exit 2) before the connection error.
    """
    from aiworker.workers.client.client import PipelineClient
    from aiworker.workers.client.temporal_client import TemporalUnreachableError

    raw = load_pipeline_file(args.file)  # a bad file is refused before connecting
    settings = command_settings(args)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        checked_pipeline(raw, args.file, settings, local_view("", settings))  # exits 2
    configure_logs(settings)
    # The root of the pipeline's trace: start, workflow, every activity attempt.
    async with cli_span(
        f"aiworker run {raw['name']}",
        pipeline=raw["name"],
        tenant=str(raw.get("tenant", "default")),
    ) as telemetry:
        try:
            pipelines = await PipelineClient.connect(
                args.profile, target_host=args.address, telemetry=telemetry, settings=settings
            )
        except TemporalUnreachableError as e:
            offline = local_view(no_answer(e, args.profile, args.address), settings)
            checked_pipeline(raw, args.file, settings, offline)
            raise
        args._client = pipelines.temporal  # the command's one connection (command_client)
        checked_pipeline(raw, args.file, settings, await command_view(args))
        if why := unknown_fields(args, raw):
            err(why)
            return EXIT_USAGE
        # the tenant's quote threshold (quote_not_accepted, exit 2); an unknown quote
        # does not block: say so
        q = await pipelines.quote_start(raw, accept_quote=args.accept_quote)
        if q is not None and q.unknown:
            steps = ", ".join(f"{u.step} ({u.reason})" for u in q.unknown)
            if not q.items:
                err(f"the cost quote is unknown (no step estimated: {steps}); started anyway")
            else:
                err(
                    f"the cost quote leaves out {steps} (p95 {q.cost_usd.p95:.6g} USD without them)"
                )
        handle = await pipelines.start(raw, workflow_id=args.id, check=False, accept_quote=True)
        return await _print_or_wait(pipelines, handle, args, raw, settings.ui_url)


async def _print_or_wait(
    pipelines: PipelineClient,
    handle: PipelineHandle,
    args: argparse.Namespace,
    pipeline: dict[str, Any],
    ui_url: str | None,
) -> int:
    from aiworker.workers.client.temporal_client import dev_ui_url
    from aiworker.workers.client.watch import wait_and_show

    if not ui_url:  # AIWORKER_UI_URL unset: the UI of the dev stack it talks to, if any
        target = pipelines.temporal.service_client.config.target_host
        ui_url = dev_ui_url(target, pipelines.settings.data_dir)
    return await wait_and_show(
        pipelines,
        handle,
        pipeline,
        ui_url,
        no_wait=args.no_wait,
        as_json=args.json,
        fields=args.field or (),
    )


def unknown_fields(args: argparse.Namespace, pipeline: dict[str, Any]) -> str | None:
    """Why ``--field`` names no field of the pipeline's ``output``, or None."""
    output = pipeline.get("output") or {}
    missing = [f for f in args.field or () if f not in output]
    if not missing:
        return None
    has = ", ".join(sorted(output)) or "none: the pipeline declares no output"
    return f"--field {missing[0]!r} is not a field of the pipeline's output (its fields: {has})"


async def cmd_check(args: argparse.Namespace) -> int:
    """``aiworker check FILE|-``: every problem of a pipeline, before anything runs
    (``--quote``: its cost quote, :mod:`aiworker.workers.cli.quote_command`)."""
    if getattr(args, "quote", False):
        from aiworker.workers.cli.quote_command import cmd_check_quote

        return await cmd_check_quote(args)
    return await check_pipeline_file(args)


async def cmd_review(args: argparse.Namespace) -> int:
    """``aiworker review ID DECISION``: the ``review`` Workflow Update."""
    outputs = None
    if args.outputs:
        try:
            outputs = json.loads(args.outputs)
        except json.JSONDecodeError as e:
            err(f"--outputs is not valid JSON: {e.msg}")
            return EXIT_USAGE
    # Corrected outputs can be large: the same external storage as the workers.
    async with pipelines_session(
        args,
        f"aiworker review {args.decision}",
        workflow_id=args.workflow_id,
        decision=args.decision,
    ) as pipelines:
        # A refused decision (WorkflowUpdateFailedError) reads as one line in `main`.
        answer = await pipelines.send_review(
            args.workflow_id,
            args.decision,
            outputs=outputs,
            reviewer=args.reviewer or os.environ.get("USER"),
            note=args.note,
            step=args.step,
        )
    print(json.dumps(answer))
    return EXIT_OK


async def cmd_callback(args: argparse.Namespace) -> int:
    """``aiworker callback TOKEN``: the ``callback`` Workflow Update of the token's run.

    Exit 0 with the run's reply; 3 for an unknown token; 2 for outputs that are
    not JSON or fail the step's schema; 1 when the token was answered otherwise,
    its wait ended, or the run's heartbeats are spent."""
    from aiworker.workers.client.callbacks import CallbackError, run_of

    outputs = None
    if args.outputs is not None:
        try:
            outputs = json.loads(args.outputs)
        except json.JSONDecodeError as e:
            err(f"--outputs is not valid JSON: {e.msg}")
            return EXIT_USAGE
        if not isinstance(outputs, dict):
            err("--outputs must be a JSON object")
            return EXIT_USAGE
    if args.extend is not None and (not args.heartbeat or not 0 < args.extend <= 365 * 86400):
        err("--extend goes with --heartbeat, in seconds (0 to 365 days)")
        return EXIT_USAGE
    try:
        run_of(args.token)
    except CallbackError as e:
        err(e.message)
        return EXIT_NOT_FOUND
    async with pipelines_session(args, "aiworker callback") as pipelines:
        try:
            if args.heartbeat:
                answer = await pipelines.heartbeat_callback(args.token, args.extend)
            elif args.fail is not None:
                answer = await pipelines.fail_callback(args.token, args.fail)
            else:
                answer = await pipelines.complete_callback(args.token, outputs or {})
        except CallbackError as e:
            err(f"callback refused ({e.status} {e.code}): {e.message}")
            if e.status == 404:
                return EXIT_NOT_FOUND
            return EXIT_USAGE if e.status == 422 else EXIT_FAILED
    print(json.dumps(answer))
    return EXIT_OK


async def cmd_list(args: argparse.Namespace) -> int:
    """``aiworker list``: pipelines by status, tenant and name, as a table or JSON."""
    from aiworker.workers.client.client import PipelineClient

    pipelines = await PipelineClient.connect(
        args.profile, target_host=args.address, settings=command_settings(args)
    )
    found = await pipelines.list_pipelines(
        status=args.status, tenant=args.tenant, pipeline=args.pipeline, limit=args.limit
    )
    rows = [row.to_json() for row in found]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'workflow id':<44} {'status':<22} {'tenant':<12} {'pipeline':<20} started")
    for r in rows:
        # ids and search attributes are anyone's text: one escaped cell each
        cell = {k: safe_text(v or "-") for k, v in r.items()}
        print(
            f"{cell['workflow_id']:<44} {cell['status']:<22} {cell['tenant']:<12} "
            f"{cell['pipeline']:<20} {cell['start_time']}"
        )
    return EXIT_OK


def redrive_inputs(given: list[str]) -> dict[str, Any]:
    """``--input STEP=JSON`` values by step.

    Raises:
        RedriveError: one is not ``STEP=JSON``, its JSON does not parse, or a
            step is given twice (exit 2, nothing started).
    """
    from aiworker.workers.client.client import RedriveError

    out: dict[str, Any] = {}
    for item in given:
        step, sep, text = item.partition("=")
        if not sep or not step:
            raise RedriveError(f"--input {item!r}: expected STEP=JSON")
        if step in out:
            raise RedriveError(f"--input {step}: given twice")
        try:
            out[step] = json.loads(text)
        except ValueError as e:
            raise RedriveError(f"--input {step}: not JSON ({e})") from None
    return out


async def cmd_redrive(args: argparse.Namespace) -> int:
    """``aiworker redrive ID``: run a failed pipeline again, reusing what succeeded."""
    from aiworker.workflows.redrive import describe_redrive

    inputs = redrive_inputs(args.step_input or [])  # bad --input: exit 2 before connecting
    if (args.workflow_id is None) == (args.query is None):
        err("aiworker redrive: give a workflow id or --query, not both or neither")
        return EXIT_USAGE
    if args.query is not None:
        from aiworker.workers.cli.bulk import redrive_query

        return await redrive_query(args, inputs)
    if args.dry_run or args.all_tenants or args.tenant or args.yes:
        err("--dry-run, --yes, --tenant and --all-tenants go with --query")
        return EXIT_USAGE
    # The old run's input and result may sit in external storage.
    async with pipelines_session(
        args, f"aiworker redrive {args.workflow_id}", workflow_id=args.workflow_id
    ) as pipelines:
        # RedriveError (running, succeeded, not a pipeline): one line and exit 2 in `main`
        pipeline = await pipelines.redrive_input(
            args.workflow_id,
            from_step=args.from_step,
            inputs=inputs,
            new_idempotency_keys=args.new_idempotency_keys,
        )
        if why := unknown_fields(args, pipeline):
            err(why)
            return EXIT_USAGE
        handle = await pipelines.start_redrive(pipeline)
        err(f"redriving {args.workflow_id} as {handle.id}: {describe_redrive(pipeline)}")
        return await _print_or_wait(pipelines, handle, args, pipeline, pipelines.settings.ui_url)


async def cmd_worker(args: argparse.Namespace) -> int:
    """``aiworker worker``: poll task queues until SIGTERM or SIGINT, then drain."""
    from aiworker.workers.devstack.supervisor import join_dev_stack, run_worker_process
    from aiworker.workers.process.telemetry import Telemetry

    # Beside `aiworker dev`, a second worker serves as the stack's own does.
    environ, joined = join_dev_stack(os.environ, profile=args.profile, address=args.address)
    if joined is not None:
        err(joined)
        args._settings = load_settings(environ)
    settings = command_settings(args)
    start_worker_process(settings)
    await run_worker_process(
        settings,
        args.task_queue or [],
        address=args.address,
        profile=args.profile,
        telemetry=Telemetry(service_name="aiworker-worker"),
        connect_wait=max(0.0, args.wait),
    )
    return EXIT_OK


def _dev_options(args: argparse.Namespace) -> DevOptions:
    from aiworker.workers.devstack.supervisor import DevOptions

    return DevOptions(
        port=args.port,
        ui_port=None if args.headless else args.ui_port,
        fast_poll=args.fast_poll,
        exit_after_pipeline=getattr(args, "exit", False),
        json_result=getattr(args, "json", False),
        local_model=not args.no_model,
        site_port=getattr(args, "site", None),
        terminate_other_builds=getattr(args, "terminate_other_builds", False),
    )


async def cmd_dev(args: argparse.Namespace) -> int:
    """``aiworker dev``: embedded Temporal server, UI and a worker until Ctrl-C."""
    from aiworker.workers.devstack.supervisor import dev_log_file, run_dev_stack

    settings = dev_settings(args.command, args.data_dir)
    start_worker_process(settings, stream=dev_log_file(settings.data_dir))
    await run_dev_stack(settings, _dev_options(args))
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace) -> int:
    """``aiworker demo``: the dev stack running one pipeline (the bundled sample)."""
    from aiworker.workers.devstack.supervisor import dev_log_file, run_dev_stack

    bundled = str(Path(__file__).parent.parent / "samples" / "demo.json")
    settings = dev_settings(args.command, args.data_dir)
    pipeline = read_pipeline(args.pipeline or bundled, settings)
    start_worker_process(settings, stream=dev_log_file(settings.data_dir))
    outcome = await run_dev_stack(
        settings, _dev_options(args), pipeline, bundled_demo=not args.pipeline
    )
    if outcome is None:  # stopped before the pipeline ended
        return EXIT_FAILED
    return outcome_code(outcome)


async def cmd_workers(args: argparse.Namespace) -> int:
    """``aiworker workers``: the live workers, with the processes and build ids
    serving them, when the live registry answers; else the local worker specs
    (saying so). As a table or JSON; a worker id and version served with
    different specs is reported on stderr. When Temporal answered, a table of the
    task queues follows: the build their new work goes to, whether a live poller
    of it is there, the pollers seen (:mod:`aiworker.workers.client.pollers`)."""
    view = await command_view(args, say="workers from")  # stderr: which, and why
    settings = command_settings(args)
    if view.source == "live" and view.registry is not None:
        specs = view.registry.specs()
        queues = await _queues_served(args, settings, specs.values())
        return _print_live_workers(
            view.registry, queues, settings.task_queue_suffix, as_json=args.json
        )
    cat = process_catalog(settings)
    entries = sorted(cat.entries.values(), key=lambda e: e.worker_id)
    queues = await _queues_served(args, settings, [e.spec for e in entries])
    if args.json:
        print(
            json.dumps(
                {
                    e.worker_id: {
                        **e.spec.model_dump(mode="json"),
                        "origin": e.origin,
                        **_queue_json(queues, settings.queue(e.spec.task_queue)),
                    }
                    for e in entries
                },
                indent=2,
            )
        )
        return EXIT_OK
    width = max([6, *(len(e.worker_id) for e in entries)])
    print(
        f"{'worker':<{width}} {'kind':<8} {'version':<8} {'task queue':<20} {'timeout':>8} "
        f"{'attempts':>8}  origin"
    )
    for e in entries:
        s = e.spec
        print(
            f"{s.worker_id:<{width}} {s.kind:<8} {s.version:<8} {s.task_queue:<20} "
            f"{s.constraints.timeout_seconds:>7g}s {s.retries.max_attempts:>8}  {e.origin}"
        )
    _print_queues(queues)
    return EXIT_OK


QueueServices: TypeAlias = "dict[tuple[str, Kind], QueueService | str]"


async def _queues_served(
    args: argparse.Namespace, settings: Settings, specs: Iterable[WorkerSpec]
) -> QueueServices:
    """Who polls the pipelines queue (workflows) and each worker's queue (activities),
    and which build takes their new work; empty when Temporal did not answer (the
    listing said so)."""
    from aiworker.schemas import names
    from aiworker.workers.client.pollers import queue_services

    client = getattr(args, "_client", None)
    if client is None:
        return {}
    queues: list[tuple[str, Kind]] = [(settings.queue(names.PIPELINES_QUEUE), "workflow")]
    queues += sorted({(settings.queue(s.task_queue), "activity") for s in specs})
    return await queue_services(client, queues)


def _queue_json(queues: QueueServices, task_queue: str) -> dict[str, Any]:
    """A worker's ``task_queue_service`` in ``--json`` (none when Temporal did not answer)."""
    found = queues.get((task_queue, "activity"))
    if found is None:
        return {}
    return {"task_queue_service": found if isinstance(found, str) else found.as_json()}


def _print_queues(queues: QueueServices) -> None:
    """One line per task queue: the build its new work goes to, whether a live poller
    of that build is there, and the pollers seen (``no poller`` where none)."""
    if not queues:
        return
    width = max(10, *(len(safe_text(q)) for q, _ in queues))
    print()
    print(f"{'task queue':<{width}} {'kind':<8} {'current build':<24} {'served':<6}  pollers")
    for (queue, kind), service in queues.items():
        if isinstance(service, str):
            print(f"{safe_text(queue):<{width}} {kind:<8} {'?':<24} {'?':<6}  {safe_text(service)}")
            continue
        current = safe_text(service.current_build or "none (unversioned)")
        served = "yes" if service.serves_current else "NO"
        print(
            f"{safe_text(queue):<{width}} {kind:<8} {current:<24} {served:<6}  "
            f"{service.pollers_text()}"
        )


def _print_live_workers(
    registry: LiveRegistry, queues: QueueServices, suffix: str, *, as_json: bool
) -> int:
    """The live registry's workers: one row per worker, version and spec hash, with
    the processes serving it and their build ids; conflicts on stderr."""
    rows = []
    # every string of an entry is the publisher's: escaped cell by cell
    for _, offers in sorted(registry.offers().items()):
        groups: dict[tuple[str, str], list[Any]] = {}
        for process, w in offers:
            groups.setdefault((w.version, w.spec_hash), []).append((process, w))
        for (_, digest), group in sorted(groups.items()):
            w = group[0][1]
            rows.append(
                {
                    **w.spec,
                    "origin": "live registry",
                    "spec_hash": digest,
                    "served": w.served,
                    "processes": [
                        {"identity": p.identity, "build_id": p.build_id} for p, _ in group
                    ],
                }
            )
    for conflict in registry.conflicts():
        err(f"conflict: {conflict}")
    if as_json:
        # the offline listing's shape (worker id -> spec and origin), plus who serves it
        specs = registry.specs()
        doc = {
            wid: {
                **specs[wid].model_dump(mode="json"),
                **_queue_json(queues, f"{specs[wid].task_queue}{suffix}"),
                "origin": "live registry",
                "processes": [
                    {
                        "identity": p.identity,
                        "build_id": p.build_id,
                        "version": w.version,
                        "spec_hash": w.spec_hash,
                        "served": w.served,
                    }
                    for p, w in offers
                ],
            }
            for wid, offers in sorted(registry.offers().items())
        }
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    width = max([6, *(len(safe_text(r["worker_id"])) for r in rows)])
    print(
        f"{'worker':<{width}} {'kind':<8} {'version':<8} {'spec':<12} "
        f"{'task queue':<20} processes (build id)"
    )
    for r in rows:
        impl = r.get("implementation") or {}
        kind = impl.get("kind", "python") if isinstance(impl, dict) else "python"
        served = ", ".join(
            f"{safe_text(p['identity'])} ({safe_text(p['build_id'])})" for p in r["processes"]
        )
        if not r["served"]:
            served = f"served elsewhere (external; known to {served})"
        print(
            f"{safe_text(r['worker_id']):<{width}} {safe_text(kind):<8} "
            f"{safe_text(r['version']):<8} {safe_text(r['spec_hash'][:12]):<12} "
            f"{safe_text(r['task_queue']):<20} {served}"
        )
    _print_queues(queues)
    return EXIT_OK


async def cmd_artifacts(args: argparse.Namespace) -> int:
    """``aiworker artifacts WF_ID``: the artifacts a workflow wrote (lineage), its
    for_each items' included (they ran in its chunk workflows, ``WF_ID/<step>/<n>``)."""
    from aiworker.workers.process.resources import close_connections, lineage_index

    settings = command_settings(args)
    try:
        records = await lineage_index(settings).records(args.workflow_id, children=True)
    finally:
        await close_connections()
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
        return EXIT_OK
    if not records:  # as `items` with no items: nothing found (``--json``: ``[]``, exit 0)
        err(f"no artifacts recorded for workflow {args.workflow_id!r}")
        return EXIT_NOT_FOUND
    print(
        f"{'step':<16} {'att':>3} {'worker':<12} {'tenant':<12} {'size':>10} "
        f"{'media type':<24} {'sha256':<16} {'trace_id':<32}  uri"
    )
    for r in records:
        print(
            f"{r.step_label(args.workflow_id):<16} {r.attempt:>3} {r.worker_id:<12} "
            f"{r.tenant:<12} {r.size_bytes:>10} {r.media_type:<24} {r.sha256[:16]:<16} "
            f"{r.trace_id or '-':<32}  {r.uri}"
        )
    return EXIT_OK


async def cmd_conformance(args: argparse.Namespace) -> int:
    """``aiworker conformance WORKER_ID``: check a live worker against its spec.

    With the live registry readable, a worker no live process serves fails at
    once (exit 1) instead of waiting for calls nobody answers, and the spec
    checked is the one the live processes publish.
    """
    from aiworker.workers.client.temporal_client import TemporalUnreachableError
    from aiworker.workers.conformance.run import check_worker, checkable_spec, load_examples
    from aiworker.workers.process.live_registry import resolve_view

    settings = command_settings(args)
    client = None
    unreachable = ""
    try:
        client = await command_client(args)
    except TemporalUnreachableError as e:
        unreachable = str(e)
    view = await resolve_view(
        client,
        settings,
        lambda: process_catalog(settings).specs,
        why_no_client=f"cannot reach Temporal: {unreachable}",
    )
    for warning in view.warnings:
        err(f"warning: {warning}")
    if view.source == "live" and view.registry is not None:
        registry = view.registry
        spec = view.specs.get(args.worker_id)
        if args.worker_id not in registry.served() and (spec is None or spec.kind != "external"):
            listed = ", ".join(sorted(registry.served())) or "none"
            err(
                f"no live worker process serves {args.worker_id!r} "
                f"(the live registry lists: {listed})"
            )
            return EXIT_FAILED
    try:
        spec = checkable_spec(view.specs, args.worker_id)
    except (KeyError, ValueError) as e:
        err(e.args[0])
        return EXIT_USAGE
    examples = None
    if args.examples:
        try:
            examples = load_examples(spec, args.examples)
        except ValueError as e:
            err(f"--examples {e}")
            return EXIT_USAGE
    if client is None:  # Temporal unreachable: the work failed, the request was fine
        err(f"cannot reach Temporal: {unreachable}")
        return EXIT_FAILED
    err(f"checking {args.worker_id!r} against its spec from {view.describe()}")
    report = await check_worker(
        client,
        spec,
        queue_suffix=settings.task_queue_suffix,
        network=args.network or args.all,
        side_effects=args.side_effects or args.all,
        examples=examples,
        call_timeout=args.timeout,
        tenant=args.tenant,
    )
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return EXIT_OK if report.passed else EXIT_FAILED


async def cmd_schemas(args: argparse.Namespace) -> int:
    """``aiworker schemas export|check``: the JSON Schemas in ``schemas/json/``."""
    from aiworker.schemas.export import check, export

    if args.action == "export":
        for p in export():
            print(p)
        return EXIT_OK
    drift = check()
    for d in drift:
        err(d)
    return EXIT_FAILED if drift else EXIT_OK


# Every command runs in an event loop of its own (``asyncio.run``), the ones that
# await nothing too, so ``main`` has one way to run them.
COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "artifacts": cmd_artifacts,
    "check": cmd_check,
    "conformance": cmd_conformance,
    "deployment": cmd_deployment,
    "demo": cmd_demo,
    "dev": cmd_dev,
    "eval": cmd_eval,
    "items": cmd_items,
    "list": cmd_list,
    "redrive": cmd_redrive,
    "cancel": cmd_cancel,
    "terminate": cmd_terminate,
    "replay": cmd_replay,
    "review": cmd_review,
    "callback": cmd_callback,
    "run": cmd_run,
    "schedule": cmd_schedule,
    "schemas": cmd_schemas,
    "serve": cmd_serve,
    "keys": cmd_keys,
    "worker": cmd_worker,
    "workers": cmd_workers,
}


def main(argv: list[str] | None = None) -> int:
    """Run one ``aiworker`` command; returns its exit code.

    Whatever a command raises ends in one line on stderr and an exit code
    (:func:`aiworker.workers.cli.errors.explain`); ``--debug`` adds the
    traceback. What any command prints goes out with its control characters
    escaped (:mod:`aiworker.workers.client.terminal`): strings from Temporal
    never drive the terminal.
    """
    from aiworker.workers.client.terminal import safe_streams

    args = build_parser().parse_args(argv)
    # Every client-side command is one span with its exit code (workers.cli.command_span).
    with safe_streams(), command_span(args) as outcome:
        return outcome(_dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    """Check the settings, then run the command; an exception ends in its exit code."""
    if args.command not in ("dev", "demo"):  # theirs are read with local defaults
        # Every command stops at once on a wrong AIWORKER_* setting (exit 2, naming
        # it), also those that would not read the setting it names; the command
        # then uses these (read once).
        command_settings(args)
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:
        from aiworker.workers.cli.errors import explain

        if args.debug:
            traceback.print_exc()
        failure = explain(e, args)
        err(failure.message)
        return failure.code


def run_main() -> None:
    """The console script: :func:`main`, then
    :func:`~aiworker.workers.cli.errors.exit_process` with its code."""
    from aiworker.workers.cli.errors import exit_process

    try:
        code = main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_FAILED)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    exit_process(code)


if __name__ == "__main__":
    run_main()
