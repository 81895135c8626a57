"""The ``aiworker`` command line.

aiworker dev                 embedded Temporal server + UI + a worker
aiworker demo [--exit]       dev stack, run the sample pipeline, print the result
aiworker worker [-q QUEUE]   a worker process polling task queues
aiworker run FILE|-          start a pipeline, wait, print the result JSON
aiworker workers             list the worker specs (the published contracts)
aiworker schemas export|check  write or check schemas/json/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from schemas import names
from schemas.settings import Settings, SettingsError
from schemas.spec import load_specs

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
    from workflows.pipeline import parse_spec

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
    from temporalio.exceptions import ApplicationError

    try:
        parse_spec(raw, set(load_specs()))
    except ApplicationError as e:
        problems = (e.details[0] or {}).get("problems", [e.message]) if e.details else [e.message]
        _err(f"{path}: invalid pipeline (invalid_input):")
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if not isinstance(raw, dict):
        raise SystemExit(EXIT_USAGE)
    return raw


async def start_pipeline(
    client: Any, settings: Settings, raw: dict[str, Any], workflow_id: str | None = None
) -> Any:
    """Start ``PipelineWorkflow`` for ``raw``; returns the handle."""
    from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

    wid = workflow_id or f"{raw['name']}-{uuid.uuid4().hex[:12]}"
    sa = TypedSearchAttributes(
        [
            SearchAttributePair(SearchAttributeKey.for_keyword(names.SA_STATUS), "queued"),
            SearchAttributePair(
                SearchAttributeKey.for_keyword(names.SA_TENANT), raw.get("tenant", "default")
            ),
            SearchAttributePair(SearchAttributeKey.for_keyword(names.SA_PIPELINE), raw["name"]),
        ]
    )
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

    from schemas.pipeline import PipelineResult

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


async def _cmd_run(args: argparse.Namespace) -> int:
    from workers.temporal_client import connect

    raw = read_pipeline(args.file)
    settings = load_settings()
    client = await connect(args.profile, target_host=args.address)
    handle = await start_pipeline(client, settings, raw, args.id)
    if args.no_wait:
        print(handle.id)
        return EXIT_OK
    code, doc = await wait_result(client, handle.id, handle.result_run_id)
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return code


async def run_worker_process(
    settings: Settings,
    queues: list[str],
    *,
    client: Any = None,
    address: str | None = None,
    profile: str | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Any = None,
) -> int:
    """Connect, register search attributes, serve metrics, poll until stopped."""
    from activities.metrics import WorkerMetrics
    from workers.http_server import Health, MetricsServer
    from workers.registry import all_queues
    from workers.temporal_client import connect
    from workers.worker import (
        StartupError,
        build_runtime,
        build_workers,
        ensure_search_attributes,
        install_signal_handlers,
        run_until_stopped,
    )

    health = Health()
    server = None
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
        if client is None:
            client = await connect(profile, target_host=address)
        await ensure_search_attributes(client)
        runtime = build_runtime(settings, WorkerMetrics())
        queues = queues or list(settings.task_queues) or all_queues(dict(runtime.specs))
        workers = build_workers(client, settings, runtime, queues)
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
    return EXIT_OK


async def _cmd_worker(args: argparse.Namespace) -> int:
    from workers.logs import configure_logging

    settings = load_settings()
    configure_logging(settings.log_level, settings.secret_values())
    return await run_worker_process(
        settings, args.task_queue or [], address=args.address, profile=args.profile
    )


def _dev_settings(args: argparse.Namespace) -> Settings:
    env = dict(os.environ)
    env.setdefault("AIWORKER_ALLOW_PRIVATE_NETWORKS", "true")
    if args.data_dir:
        env["AIWORKER_DATA_DIR"] = args.data_dir
    return load_settings(env)


async def _dev(args: argparse.Namespace, pipeline: dict[str, Any] | None) -> int:
    from workers.devserver import DevServer, DevServerError
    from workers.logs import configure_logging
    from workers.temporal_client import connect

    settings = _dev_settings(args)
    configure_logging(
        settings.log_level,
        settings.secret_values(),
        stream=_log_file(settings.data_dir),
    )
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
    try:
        client = await connect(target_host=server.address, namespace="default")
        ready = asyncio.Event()
        worker_task = asyncio.create_task(
            run_worker_process(settings, [], client=client, stop=stop, on_ready=ready.set)
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


def _cmd_workers(args: argparse.Namespace) -> int:
    specs = load_specs()
    if args.json:
        print(json.dumps({k: v.model_dump(mode="json") for k, v in specs.items()}, indent=2))
        return EXIT_OK
    print(
        f"{'worker':<12} {'version':<8} {'task queue':<20} {'timeout':>8} {'attempts':>8}  purpose"
    )
    for s in specs.values():
        print(
            f"{s.worker_id:<12} {s.version:<8} {s.task_queue:<20} "
            f"{s.constraints.timeout_seconds:>7g}s {s.retries.max_attempts:>8}  {s.purpose}"
        )
    return EXIT_OK


def _cmd_schemas(args: argparse.Namespace) -> int:
    from schemas.export import check, export

    if args.action == "export":
        for p in export():
            print(p)
        return EXIT_OK
    drift = check()
    for d in drift:
        _err(d)
    return EXIT_FAILED if drift else EXIT_OK


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

    ws = sub.add_parser("workers", help="list worker specs")
    ws.add_argument("--json", action="store_true")

    sc = sub.add_parser("schemas", help="export or check the JSON Schemas in schemas/json")
    sc.add_argument("action", choices=["export", "check"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return asyncio.run(_cmd_run(args))
        if args.command == "worker":
            return asyncio.run(_cmd_worker(args))
        if args.command == "dev":
            return asyncio.run(_dev(args, None))
        if args.command == "demo":
            raw = read_pipeline(
                args.pipeline or str(Path(__file__).parent / "samples" / "demo.json")
            )
            return asyncio.run(_dev(args, raw))
        if args.command == "workers":
            return _cmd_workers(args)
        if args.command == "schemas":
            return _cmd_schemas(args)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        if "connect" in str(e).lower():
            _err(f"cannot reach Temporal: {e}")
            return EXIT_FAILED
        raise
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
