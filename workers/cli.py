"""The ``aiworker`` command line.

aiworker dev                 embedded Temporal server + UI + a worker
aiworker demo [--exit]       dev stack, run the sample pipeline, print the result
aiworker worker [-q QUEUE]   a worker process polling task queues
aiworker run FILE|-          start a pipeline, wait, print the result JSON
aiworker review ID DECISION  approve|reject|retry an escalated step (Workflow Update)
aiworker list [--status S]   pipelines by status, tenant, name (visibility query)
aiworker redrive ID          run a failed pipeline again, reusing its succeeded steps
aiworker workers             list the worker specs (the published contracts)
aiworker artifacts WF_ID     list the artifacts a workflow wrote (lineage)
aiworker schemas export|check  write or check schemas/json/
aiworker conformance WORKER_ID  check a live worker against its spec through Temporal
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiworker.schemas import names
from aiworker.schemas.catalog import Catalog
from aiworker.schemas.settings import Settings, SettingsError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _err(msg: str) -> None:
    print(f"aiworker: {msg}", file=sys.stderr)


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Settings from the environment; exits with the variable's name on error."""
    try:
        return Settings.from_env(os.environ if env is None else env)
    except SettingsError as e:
        _err(f"invalid settings: {e}")
        raise SystemExit(EXIT_USAGE) from None


def read_pipeline(path: str) -> dict[str, Any]:
    """Read and check a pipeline file (``-`` for stdin); exit 2 with the reason."""
    from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as e:
        _err(f"cannot read {path}: {e.strerror}")
        raise SystemExit(EXIT_USAGE) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        _err(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}")
        raise SystemExit(EXIT_USAGE) from None
    try:
        parse_pipeline(raw, set(process_catalog().specs))
    except PipelineSpecError as e:
        _err(f"{path}: invalid pipeline (invalid_input):")
        for p in e.problems:
            print(f"  - {p}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if not isinstance(raw, dict):
        raise SystemExit(EXIT_USAGE)
    return raw


async def start_pipeline(
    client: Any, settings: Settings, raw: dict[str, Any], workflow_id: str | None = None
) -> Any:
    """Start ``PipelineWorkflow`` for ``raw``; returns the handle."""
    wid = workflow_id or f"{raw['name']}-{uuid.uuid4().hex[:12]}"
    sa = names.pipeline_search_attributes("queued", raw.get("tenant", "default"), raw["name"])
    return await client.start_workflow(
        names.PIPELINE_WORKFLOW,
        raw,
        id=wid,
        task_queue=settings.queue(names.PIPELINES_QUEUE),
        search_attributes=sa,
        static_summary=f"pipeline {raw['name']} (tenant {raw.get('tenant', 'default')})",
    )


async def wait_result(
    client: Any, workflow_id: str, run_id: str | None = None
) -> tuple[int, dict[str, Any]]:
    """Wait for a pipeline; returns (exit code, printable result)."""
    from temporalio.client import WorkflowFailureError

    from aiworker.schemas.pipeline import PipelineResult

    try:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=PipelineResult)
        result = await handle.result()
    except WorkflowFailureError as e:
        cause = e.cause
        code = getattr(cause, "type", None) or type(cause).__name__
        doc = {
            "workflow_id": workflow_id,
            "status": "failed",
            "error_code": code,
            "error": str(cause),
        }
        details = getattr(cause, "details", None)
        if details and isinstance(details[0], dict) and "problems" in details[0]:
            doc["problems"] = details[0]["problems"]
        return EXIT_FAILED, doc
    doc = {"workflow_id": workflow_id, **result.model_dump(mode="json")}
    return (EXIT_OK if result.status == "succeeded" else EXIT_FAILED), doc


def _configure_logs(settings: Settings, stream: Any = None) -> None:
    from aiworker.workers.logs import configure_logging
    from aiworker.workers.telemetry import otlp_header_secrets

    configure_logging(
        settings.log_level,
        [*settings.secret_values(), *otlp_header_secrets(os.environ)],
        stream=stream,
    )


@contextlib.asynccontextmanager
async def _cli_span(name: str, **attributes: str) -> AsyncIterator[Any]:
    """Telemetry for one CLI command: the root span of what it starts or changes
    (the SDK's tracing interceptor carries it into the workflow), ended and
    exported, with the process's S3 connections closed, when the command ends."""
    from opentelemetry import trace

    from aiworker.workers.resources import close_connections
    from aiworker.workers.telemetry import Telemetry

    telemetry = Telemetry(sdk_metrics=False, service_name="aiworker-cli")
    tracer = trace.get_tracer("aiworker.cli")
    try:
        with tracer.start_as_current_span(
            name, attributes={f"aiworker.{k}": v for k, v in attributes.items()}
        ):
            yield telemetry
    finally:
        telemetry.shutdown()
        await close_connections()  # the S3 client that large payloads may have used


async def _cmd_run(args: argparse.Namespace) -> int:
    from aiworker.workers.temporal_client import connect

    raw = read_pipeline(args.file)
    settings = load_settings()
    _configure_logs(settings)
    # The root of the pipeline's trace: start, workflow, every activity attempt.
    async with _cli_span(
        f"aiworker run {raw['name']}",
        pipeline=raw["name"],
        tenant=raw.get("tenant", "default"),
    ) as telemetry:
        client = await connect(
            args.profile, target_host=args.address, telemetry=telemetry, settings=settings
        )
        handle = await start_pipeline(client, settings, raw, args.id)
        return await _print_or_wait(client, handle, args.no_wait)


async def _print_or_wait(client: Any, handle: Any, no_wait: bool) -> int:
    """Print the workflow id (``--no-wait``) or wait and print the result JSON."""
    if no_wait:
        print(handle.id)
        return EXIT_OK
    code, doc = await wait_result(client, handle.id, handle.result_run_id)
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return code


async def send_review(
    client: Any,
    workflow_id: str,
    decision: str,
    *,
    outputs: dict[str, Any] | None = None,
    reviewer: str | None = None,
    note: str | None = None,
    step: str | None = None,
) -> dict[str, Any]:
    """Send the ``review`` Workflow Update; returns the workflow's answer."""
    arg: dict[str, Any] = {"decision": decision, "reviewer": reviewer or "unknown"}
    if outputs is not None:
        arg["outputs"] = outputs
    if note:
        arg["note"] = note
    if step:
        arg["step"] = step
    handle = client.get_workflow_handle(workflow_id)
    result: dict[str, Any] = await handle.execute_update(names.REVIEW_UPDATE, arg, result_type=dict)
    return result


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def list_query(
    status: str | None = None, tenant: str | None = None, pipeline: str | None = None
) -> str:
    """The visibility query for pipelines with these search attribute values."""
    parts = [f"WorkflowType = {_quote(names.PIPELINE_WORKFLOW)}"]
    for key, value in (
        (names.SA_STATUS, status),
        (names.SA_TENANT, tenant),
        (names.SA_PIPELINE, pipeline),
    ):
        if value:
            parts.append(f"{key} = {_quote(value)}")
    return " AND ".join(parts)


async def list_pipelines(
    client: Any,
    *,
    status: str | None = None,
    tenant: str | None = None,
    pipeline: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Pipelines matching the filters, newest first (at most ``limit``)."""
    out: list[dict[str, Any]] = []
    query = list_query(status, tenant, pipeline)
    async for wf in client.list_workflows(query, limit=limit):
        sa = wf.typed_search_attributes
        out.append(
            {
                "workflow_id": wf.id,
                "run_id": wf.run_id,
                "status": _sa(sa, names.SA_STATUS),
                "tenant": _sa(sa, names.SA_TENANT),
                "pipeline": _sa(sa, names.SA_PIPELINE),
                "execution_status": wf.status.name if wf.status else None,
                "start_time": wf.start_time.isoformat() if wf.start_time else None,
            }
        )
    return out


def _sa(attrs: Any, name: str) -> Any:
    from temporalio.common import SearchAttributeKey

    return attrs.get(SearchAttributeKey.for_keyword(name))


class RedriveError(RuntimeError):
    """The pipeline cannot be redriven; the message says why."""


async def redrive_input(client: Any, workflow_id: str) -> dict[str, Any]:
    """The input of a new run that reuses the steps a failed run finished.

    The original pipeline comes from the first event of the failed run's
    history; the finished steps from its result, or (when the run failed,
    was cancelled or terminated) from its ``progress`` query. ``resume_from``
    names the first run, so the new run keeps its idempotency keys.
    """
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    from aiworker.schemas.pipeline import PipelineResult

    handle = client.get_workflow_handle(workflow_id)
    desc = await handle.describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise RedriveError(f"{workflow_id} is still running; cancel it or wait")
    history = await handle.fetch_history()
    first = history.events[0].workflow_execution_started_event_attributes
    decoded = await client.data_converter.decode(first.input.payloads)
    pipeline = dict(decoded[0])
    steps: dict[str, Any] = {}
    try:
        result = await client.get_workflow_handle(
            workflow_id, run_id=desc.run_id, result_type=PipelineResult
        ).result()
        if result.status == "succeeded":
            raise RedriveError(f"{workflow_id} succeeded; nothing to redrive")
        steps = {k: v.model_dump(mode="json") for k, v in result.steps.items()}
    except WorkflowFailureError:
        progress = await handle.query(names.PROGRESS_QUERY, True)
        steps = dict(progress.get("steps") or {})
    reuse = {
        sid: r
        for sid, r in steps.items()
        if isinstance(r, dict) and r.get("status") in names.OK_STATUSES
    }
    previous = pipeline.get("resume_from") or {}
    root = previous.get("workflow_id") or workflow_id
    pipeline["resume_from"] = {"workflow_id": root, "run_id": desc.run_id, "steps": reuse}
    return pipeline


async def redrive(client: Any, settings: Settings, workflow_id: str) -> Any:
    """Start the failed pipeline ``workflow_id`` again; returns the new handle."""
    from aiworker.schemas.pipeline import PipelineResult

    pipeline = await redrive_input(client, workflow_id)
    root = pipeline["resume_from"]["workflow_id"]
    handle = await start_pipeline(
        client, settings, pipeline, f"{root}-redrive-{uuid.uuid4().hex[:8]}"
    )
    return client.get_workflow_handle(
        handle.id, run_id=handle.result_run_id, result_type=PipelineResult
    )


async def _cmd_review(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowUpdateFailedError

    from aiworker.workers.temporal_client import connect

    outputs = None
    if args.outputs:
        try:
            outputs = json.loads(args.outputs)
        except json.JSONDecodeError as e:
            _err(f"--outputs is not valid JSON: {e.msg}")
            return EXIT_USAGE
    settings = load_settings()
    _configure_logs(settings)
    async with _cli_span(
        f"aiworker review {args.decision}", workflow_id=args.workflow_id, decision=args.decision
    ) as telemetry:
        # Corrected outputs can be large: the same external storage as the workers.
        client = await connect(
            args.profile, target_host=args.address, settings=settings, telemetry=telemetry
        )
        try:
            answer = await send_review(
                client,
                args.workflow_id,
                args.decision,
                outputs=outputs,
                reviewer=args.reviewer or os.environ.get("USER"),
                note=args.note,
                step=args.step,
            )
        except WorkflowUpdateFailedError as e:
            _err(f"review rejected: {e.cause}")
            return EXIT_FAILED
    print(json.dumps(answer))
    return EXIT_OK


async def _cmd_list(args: argparse.Namespace) -> int:
    from aiworker.workers.temporal_client import connect

    client = await connect(args.profile, target_host=args.address)
    rows = await list_pipelines(
        client, status=args.status, tenant=args.tenant, pipeline=args.pipeline, limit=args.limit
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'workflow id':<44} {'status':<22} {'tenant':<12} {'pipeline':<20} started")
    for r in rows:
        print(
            f"{r['workflow_id']:<44} {r['status'] or '-':<22} {r['tenant'] or '-':<12} "
            f"{r['pipeline'] or '-':<20} {r['start_time'] or '-'}"
        )
    return EXIT_OK


async def _cmd_redrive(args: argparse.Namespace) -> int:
    from aiworker.workers.temporal_client import connect

    settings = load_settings()
    _configure_logs(settings)
    async with _cli_span(
        f"aiworker redrive {args.workflow_id}", workflow_id=args.workflow_id
    ) as telemetry:
        # The old run's input and result may sit in external storage.
        client = await connect(
            args.profile, target_host=args.address, settings=settings, telemetry=telemetry
        )
        try:
            handle = await redrive(client, settings, args.workflow_id)
        except RedriveError as e:
            _err(str(e))
            return EXIT_USAGE
        return await _print_or_wait(client, handle, args.no_wait)


async def run_worker_process(
    settings: Settings,
    queues: list[str],
    *,
    client: Any = None,
    address: str | None = None,
    profile: str | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Any = None,
    telemetry: Any = None,
) -> int:
    """Connect, register search attributes, serve metrics, poll until stopped.

    With a ``workers.telemetry.Telemetry`` the SDK's own metrics join
    aiworker's on the same ``/metrics``, and a client made here gets its
    runtime and tracing interceptors.
    """
    from prometheus_client import REGISTRY

    from aiworker.activities.metrics import WorkerMetrics
    from aiworker.workers.http_server import Health, MetricsServer
    from aiworker.workers.registry import all_queues
    from aiworker.workers.temporal_client import connect
    from aiworker.workers.worker import (
        StartupError,
        build_runtime,
        build_workers,
        ensure_search_attributes,
        install_signal_handlers,
        load_process_workers,
        run_until_stopped,
    )

    health = Health()
    server = None
    if telemetry is not None:
        telemetry.register(REGISTRY)
        telemetry.start()
    if settings.metrics_port:
        try:
            server = MetricsServer(settings.metrics_host, settings.metrics_port, health).start()
        except OSError as e:
            _err(
                f"cannot serve metrics on port {settings.metrics_port}: {e.strerror} "
                "(set AIWORKER_METRICS_PORT, 0 disables)"
            )
            return EXIT_USAGE
    try:
        # A broken plugin is reported even when Temporal is unreachable.
        served = load_process_workers(settings)
        if client is None:
            client = await connect(
                profile, target_host=address, telemetry=telemetry, settings=settings
            )
        await ensure_search_attributes(client)
        runtime = build_runtime(settings, WorkerMetrics(), workers=served)
        queues = queues or list(settings.task_queues) or all_queues(runtime.specs, served)
        workers = build_workers(client, settings, runtime, queues, workers=served)
        stop = stop or asyncio.Event()
        install_signal_handlers(stop)
        if on_ready:
            on_ready()
        await run_until_stopped(workers, stop, health)
    except StartupError as e:
        _err(str(e))
        return EXIT_USAGE
    finally:
        if server:
            server.stop()
        if telemetry is not None:
            telemetry.shutdown()
        from aiworker.workers.resources import close_connections

        await close_connections()
    return EXIT_OK


async def _cmd_worker(args: argparse.Namespace) -> int:
    from aiworker.workers.telemetry import Telemetry

    settings = load_settings()
    _configure_logs(settings)
    return await run_worker_process(
        settings,
        args.task_queue or [],
        address=args.address,
        profile=args.profile,
        telemetry=Telemetry(service_name="aiworker-worker"),
    )


def _dev_settings(args: argparse.Namespace) -> Settings:
    env = dict(os.environ)
    env.setdefault("AIWORKER_ALLOW_PRIVATE_NETWORKS", "true")
    if args.command == "demo":
        # the seed's 10/min per tenant would make a second demo run within a
        # minute wait; the demo tenant may scrape the bundled site faster
        env.setdefault("AIWORKER_RATE_LIMITS", "web-scrape:demo=120/min")
    if args.data_dir:
        env["AIWORKER_DATA_DIR"] = args.data_dir
    return load_settings(env)


async def _dev(
    args: argparse.Namespace, pipeline: dict[str, Any] | None, bundled_demo: bool = False
) -> int:
    from aiworker.workers.demo_site import DemoSite
    from aiworker.workers.devserver import DevServer, DevServerError
    from aiworker.workers.telemetry import Telemetry
    from aiworker.workers.temporal_client import connect

    settings = _dev_settings(args)
    _configure_logs(settings, stream=_log_file(settings.data_dir))
    telemetry = Telemetry()
    server = DevServer(
        settings.data_dir,
        port=args.port,
        ui_port=None if args.headless else args.ui_port,
        fast_poll=args.fast_poll,
    )
    try:
        server.start()
    except DevServerError as e:
        _err(str(e))
        return EXIT_USAGE
    stop = asyncio.Event()
    code = EXIT_OK
    site: DemoSite | None = None
    try:
        client = await connect(
            target_host=server.address, namespace="default", telemetry=telemetry, settings=settings
        )
        ready = asyncio.Event()
        worker_task = asyncio.create_task(
            run_worker_process(
                settings, [], client=client, stop=stop, on_ready=ready.set, telemetry=telemetry
            )
        )
        ready_wait = asyncio.create_task(ready.wait())
        await asyncio.wait([worker_task, ready_wait], return_when=asyncio.FIRST_COMPLETED)
        if worker_task.done():
            ready_wait.cancel()
            return worker_task.result()
        print(f"Temporal server: {server.address}   (data: {settings.data_dir})", flush=True)
        if server.ui_url:
            print(f"Temporal UI:     {server.ui_url}", flush=True)
        print(
            f"Worker polling:  all task queues; logs in {settings.data_dir / 'worker.log'}",
            flush=True,
        )
        if pipeline is not None and bundled_demo:
            site = DemoSite().start()
            pipeline = {
                **pipeline,
                "inputs": {
                    **pipeline.get("inputs", {}),
                    "site_url": site.url,
                    "llm_enabled": bool(settings.llm_base_url),
                },
            }
            print(f"Sample site:     {site.url} (bundled, served on loopback)", flush=True)
            if not settings.llm_base_url:
                print(
                    "LLM summary:     skipped (no model configured; set AIWORKER_LLM_BASE_URL "
                    "and AIWORKER_LLM_MODEL to include it)",
                    flush=True,
                )
        if pipeline is not None:
            handle = await start_pipeline(client, settings, pipeline)
            print(f"Started pipeline {pipeline['name']}: workflow id {handle.id}", flush=True)
            if server.ui_url:
                print(f"  {server.ui_url}/namespaces/default/workflows/{handle.id}", flush=True)
            result_task = asyncio.create_task(wait_result(client, handle.id, handle.result_run_id))
            stop_wait = asyncio.create_task(stop.wait())
            await asyncio.wait(
                [result_task, stop_wait, worker_task], return_when=asyncio.FIRST_COMPLETED
            )
            stop_wait.cancel()
            if result_task.done():
                code, doc = result_task.result()
                print(json.dumps(doc, indent=2, ensure_ascii=False), flush=True)
            else:
                result_task.cancel()
                code = EXIT_FAILED
            if args.exit:
                stop.set()
        if not stop.is_set() and not worker_task.done():
            print("Press Ctrl-C to stop.", flush=True)
        worker_code = await worker_task
        code = code or worker_code
    finally:
        if site is not None:
            site.stop()
        stop.set()
        if "worker_task" in locals() and not worker_task.done():
            try:
                await asyncio.wait_for(worker_task, settings.shutdown_grace_seconds + 10)
            except BaseException:
                pass
        server.stop()
    return code


def _log_file(data_dir: Path) -> Any:
    """The dev stack's worker log (the terminal shows only what a person needs)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return open(data_dir / "worker.log", "a")


def process_catalog() -> Catalog:
    """Every worker this process would know as a worker process (built-ins, plugins,
    spec files), installed; exits 2 naming a broken plugin or spec file."""
    from aiworker.workers.worker import StartupError, load_process_workers

    try:
        return load_process_workers(load_settings()).catalog
    except StartupError as e:
        _err(str(e))
        raise SystemExit(EXIT_USAGE) from None


def _cmd_workers(args: argparse.Namespace) -> int:
    cat = process_catalog()
    entries = sorted(cat.entries.values(), key=lambda e: e.worker_id)
    if args.json:
        print(
            json.dumps(
                {
                    e.worker_id: {**e.spec.model_dump(mode="json"), "origin": e.origin}
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
    return EXIT_OK


async def _cmd_artifacts(args: argparse.Namespace) -> int:
    from aiworker.workers.resources import close_connections, lineage_index

    settings = load_settings()
    try:
        records = await lineage_index(settings).records(args.workflow_id)
    finally:
        await close_connections()
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
        return EXIT_OK
    if not records:
        _err(f"no artifacts recorded for workflow {args.workflow_id!r}")
        return EXIT_FAILED
    print(
        f"{'step':<16} {'att':>3} {'worker':<12} {'tenant':<12} {'size':>10} "
        f"{'media type':<24} {'sha256':<16} {'trace_id':<32}  uri"
    )
    for r in records:
        print(
            f"{r.step_id or '-':<16} {r.attempt:>3} {r.worker_id:<12} {r.tenant:<12} "
            f"{r.size_bytes:>10} {r.media_type:<24} {r.sha256[:16]:<16} "
            f"{r.trace_id or '-':<32}  {r.uri}"
        )
    return EXIT_OK


async def _cmd_conformance(args: argparse.Namespace) -> int:
    from aiworker.workers.conformance import check_worker, load_examples
    from aiworker.workers.temporal_client import connect

    specs = process_catalog().specs
    spec = specs.get(args.worker_id)
    if spec is None:
        known = ", ".join(sorted(specs))
        _err(f"unknown worker {args.worker_id!r}; known: {known}")
        return EXIT_USAGE
    examples = None
    if args.examples:
        try:
            examples = load_examples(spec, args.examples)
        except ValueError as e:
            _err(f"--examples {e}")
            return EXIT_USAGE
    settings = load_settings()
    try:
        client = await connect(args.profile, target_host=args.address, settings=settings)
    except RuntimeError as e:
        _err(f"cannot reach Temporal: {e}")
        return EXIT_USAGE
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


def _cmd_schemas(args: argparse.Namespace) -> int:
    from aiworker.schemas.export import check, export

    if args.action == "export":
        for p in export():
            print(p)
        return EXIT_OK
    drift = check()
    for d in drift:
        _err(d)
    return EXIT_FAILED if drift else EXIT_OK


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 3600 seconds")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aiworker", description="Durable AI workers on Temporal.")
    sub = p.add_subparsers(dest="command", required=True)

    def conn(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", help="Temporal frontend host:port (default: envconfig)")
        sp.add_argument("--profile", help="envconfig profile name")

    w = sub.add_parser("worker", help="run a worker process")
    w.add_argument(
        "-q",
        "--task-queue",
        action="append",
        help="base task queue to poll (repeatable; default AIWORKER_TASK_QUEUES or all)",
    )
    conn(w)

    r = sub.add_parser("run", help="start a pipeline and print its result")
    r.add_argument("file", help="pipeline JSON file, or - for stdin")
    r.add_argument("--no-wait", action="store_true", help="print the workflow id and return")
    r.add_argument("--id", help="workflow id (default: <name>-<random>)")
    conn(r)

    for name, helptext in (
        ("dev", "embedded Temporal server, UI and worker"),
        ("demo", "dev stack plus the sample pipeline"),
    ):
        d = sub.add_parser(name, help=helptext)
        d.add_argument("--port", type=int, default=7233)
        d.add_argument("--ui-port", type=int, default=8233)
        d.add_argument("--headless", action="store_true", help="no Web UI")
        d.add_argument("--data-dir", help="default AIWORKER_DATA_DIR or ./.aiworker")
        d.add_argument(
            "--fast-poll",
            action="store_true",
            help="lower idle latency at some cost of peak throughput",
        )
        if name == "demo":
            d.add_argument("--pipeline", help="pipeline file (default: the bundled sample)")
            d.add_argument("--exit", action="store_true", help="stop after the pipeline ends")

    rv = sub.add_parser("review", help="decide on a step awaiting review (Workflow Update)")
    rv.add_argument("workflow_id")
    rv.add_argument("decision", choices=["approve", "reject", "retry"])
    rv.add_argument("--outputs", help="corrected outputs as JSON (approve)")
    rv.add_argument("--reviewer", help="who decides (default $USER)")
    rv.add_argument("--note", help="a note kept in the step's result")
    rv.add_argument("--step", help="the step, when several await review")
    conn(rv)

    ls = sub.add_parser("list", help="list pipelines through visibility queries")
    ls.add_argument("--status", help="e.g. running, awaiting_review, failed")
    ls.add_argument("--tenant")
    ls.add_argument("--pipeline", help="pipeline name")
    ls.add_argument("--limit", type=int, default=100)
    ls.add_argument("--json", action="store_true")
    conn(ls)

    rd = sub.add_parser("redrive", help="run a failed pipeline again, reusing succeeded steps")
    rd.add_argument("workflow_id")
    rd.add_argument("--no-wait", action="store_true", help="print the new workflow id and return")
    conn(rd)

    ws = sub.add_parser("workers", help="list worker specs")
    ws.add_argument("--json", action="store_true")

    ar = sub.add_parser("artifacts", help="list the artifacts a workflow wrote (lineage)")
    ar.add_argument("workflow_id")
    ar.add_argument("--json", action="store_true", help="one JSON array with every field")

    sc = sub.add_parser("schemas", help="export or check the JSON Schemas in schemas/json")
    sc.add_argument("action", choices=["export", "check"])

    cf = sub.add_parser("conformance", help="check a live worker against its spec through Temporal")
    cf.add_argument("worker_id")
    cf.add_argument(
        "--network", action="store_true", help="also run examples that reach a site or a model"
    )
    cf.add_argument(
        "--side-effects",
        action="store_true",
        help="also run the examples of a worker with side effects (publish)",
    )
    cf.add_argument("--all", action="store_true", help="--network and --side-effects")
    cf.add_argument("--examples", help="a JSON file of examples to run instead of the spec's")
    cf.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=60.0,
        help="seconds each call may take, retries included (default 60)",
    )
    cf.add_argument("--tenant", default="default", help="the tenant of the requests")
    cf.add_argument("--json", action="store_true", help="print the report as JSON")
    conn(cf)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return asyncio.run(_cmd_run(args))
        if args.command == "worker":
            return asyncio.run(_cmd_worker(args))
        if args.command == "review":
            return asyncio.run(_cmd_review(args))
        if args.command == "list":
            return asyncio.run(_cmd_list(args))
        if args.command == "redrive":
            return asyncio.run(_cmd_redrive(args))
        if args.command == "dev":
            return asyncio.run(_dev(args, None))
        if args.command == "demo":
            raw = read_pipeline(
                args.pipeline or str(Path(__file__).parent / "samples" / "demo.json")
            )
            return asyncio.run(_dev(args, raw, bundled_demo=not args.pipeline))
        if args.command == "workers":
            return _cmd_workers(args)
        if args.command == "artifacts":
            return asyncio.run(_cmd_artifacts(args))
        if args.command == "schemas":
            return _cmd_schemas(args)
        if args.command == "conformance":
            return asyncio.run(_cmd_conformance(args))
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        if "connect" in str(e).lower():
            _err(f"cannot reach Temporal: {e}")
            return EXIT_FAILED
        raise
    return EXIT_USAGE


def run_main() -> None:
    """The console script: :func:`main`, then exit without interpreter finalization.

    Temporal Core's Rust threads can still call into Python while the
    interpreter finalizes, which aborts a short-lived client process now and
    then (``Fatal Python error: PyGILState_Release``, temporalio/sdk-python#300).
    Everything is flushed first; nothing else is left to clean up at exit.
    """
    try:
        code = main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_FAILED)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_main()
