"""The processes the command line supervises: a worker process and the dev stack.

``aiworker worker`` is :func:`run_worker_process`: load the process's
workers, connect, register search attributes, serve ``/metrics`` and the
probes, poll (publishing what it serves to the live registry in the
background, :mod:`aiworker.workers.process.live_registry`) until SIGTERM or SIGINT,
withdraw from the registry, drain, exit.

``aiworker dev`` and ``aiworker demo`` are :func:`run_dev_stack`, which
owns everything it starts and stops it in reverse order on every path out:

    embedded Temporal server (child process, stopped by PID)
      + the local model as the `default` alias, when none is configured
        (llama-server child process, stopped by PID; workers/devstack/modelserver.py)
      -> this process as a worker of every task queue (drained within its grace)
        -> the bundled sample site (demo)
          -> one pipeline, its outcome printed (demo)

Ctrl-C (or the pipeline's end, with ``--exit``) sets the one stop event; the
worker drains, then the server stops. Start-up problems raise
:class:`~aiworker.workers.errors.StartupError` or
:class:`~aiworker.workers.devstack.devserver.DevServerError` with a message for a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.workers.cli.common import print_outcome, warn_duplicates
from aiworker.workers.errors import StartupError

if TYPE_CHECKING:
    from aiworker.workers.devstack import state
    from aiworker.workers.devstack.modelserver import ModelServer
    from aiworker.workers.process.telemetry import Telemetry

# The worker's own drain is bounded by the grace period; this covers the rest.
_DRAIN_MARGIN_SECONDS = 10
# How long a worker or the dev stack waits for the Temporal frontend to be healthy.
CONNECT_WAIT_SECONDS = 60.0


def _say_waiting(seconds: float) -> Callable[[str], None]:
    def say(target: str) -> None:
        print(
            f"aiworker: waiting for Temporal at {target} to be healthy (up to {seconds:g}s)",
            file=sys.stderr,
            flush=True,
        )

    return say


async def run_worker_process(
    settings: Settings,
    queues: list[str],
    *,
    client: Client | None = None,
    address: str | None = None,
    profile: str | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[], None] | None = None,
    telemetry: Telemetry | None = None,
    connect_wait: float = CONNECT_WAIT_SECONDS,
    other_builds: Literal["drain", "terminate"] | None = None,
) -> None:
    """Connect, register search attributes, serve metrics, poll until stopped.

    Args:
        settings: the process's settings.
        queues: the base task queues to poll; ``AIWORKER_TASK_QUEUES`` or every
            queue of the process's workers when empty.
        client: a connected client to use; one is made from envconfig otherwise.
        address: the frontend (``host:port``) over envconfig's, when connecting here.
        profile: the envconfig profile, when connecting here.
        stop: set to stop polling and drain; SIGTERM and SIGINT set it.
        on_ready: called once the workers poll.
        telemetry: the process's telemetry; the SDK's own metrics join
            aiworker's on the same ``/metrics``, and a client made here gets
            its runtime and tracing interceptors.
        connect_wait: seconds to wait for the frontend to be healthy when
            connecting here (a worker pod may start before its server).
        other_builds: with versioning, once it polls, say which running pinned runs
            of this deployment belong to another build (``aiworker dev``): they wait
            for a worker of their build (``drain``) or are terminated
            (``terminate``); never replayed on this code.

    Raises:
        StartupError: a broken plugin, the metrics port taken, a search
            attribute that cannot be registered, an unknown task queue.
        TemporalUnreachableError: the frontend was not healthy in time.
    """
    from prometheus_client import REGISTRY

    from aiworker.activities.metrics import WorkerMetrics
    from aiworker.workers.client.temporal_client import connect
    from aiworker.workers.process.live_registry import live_entry, publishing
    from aiworker.workers.process.probes import Health, MetricsServer
    from aiworker.workers.process.resources import build_runtime, close_connections
    from aiworker.workers.process.task_queues import default_queues
    from aiworker.workers.process.worker import (
        build_workers,
        ensure_search_attributes,
        freeze_startup_heap,
        install_signal_handlers,
        load_process_workers,
        run_until_stopped,
    )

    if settings.versioning is None:  # unset: a worker process is a deployment version
        settings = settings.model_copy(update={"versioning": True})
    health = Health()
    server = None
    if telemetry is not None:
        telemetry.register(REGISTRY)
        telemetry.start()
    try:
        if settings.metrics_port:
            try:
                server = MetricsServer(settings.metrics_host, settings.metrics_port, health).start()
            except OSError as e:
                raise StartupError(
                    f"cannot serve metrics on port {settings.metrics_port}: {e.strerror} "
                    "(set AIWORKER_METRICS_PORT, 0 disables)"
                ) from None
        # A broken plugin is reported even when Temporal is unreachable.
        served = load_process_workers(settings)
        if client is None:
            client = await connect(
                profile,
                target_host=address,
                telemetry=telemetry,
                settings=settings,
                wait_seconds=connect_wait,
                on_wait=_say_waiting(connect_wait),
            )
        await ensure_search_attributes(client)
        runtime = build_runtime(settings, WorkerMetrics(), workers=served)
        queues = queues or list(settings.task_queues) or default_queues(runtime.specs, served)
        workers = build_workers(client, settings, runtime, queues, workers=served)
        stop = stop or asyncio.Event()
        install_signal_handlers(stop)
        freeze_startup_heap()  # everything is imported and built: it lives as long as we do
        # With versioning, "ready" waits until the build is current (or said not to be)
        settle = (
            asyncio.create_task(_settle_version(client, settings, other_builds, on_ready))
            if settings.versioning
            else None
        )
        if on_ready and settle is None:
            on_ready()
        try:
            async with contextlib.AsyncExitStack() as registry:
                if settings.registry_ttl_seconds > 0:
                    entry = live_entry(client, settings, runtime, served, queues)
                    await registry.enter_async_context(
                        publishing(client, settings, entry, until=stop)
                    )
                await run_until_stopped(workers, stop, health)
        finally:
            if settle is not None:
                settle.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await settle
            # Chromium and its driver (if a step rendered a page), then the HTTP clients'
            # connection pools, so that none is left for the interpreter to find unclosed
            for name in ("render", "fetch_url", "http_post"):
                tool = runtime.tools.get(name)
                if tool is not None:
                    await tool.aclose()
    finally:
        if server:
            server.stop()
        if telemetry is not None:
            telemetry.shutdown()
        await close_connections()


async def _settle_version(
    client: Client,
    settings: Settings,
    other_builds: Literal["drain", "terminate"] | None,
    on_ready: Callable[[], None] | None,
) -> None:
    """Once this process polls: make its build current as the settings say (or say
    that it is not), then, for ``aiworker dev``, say which running runs belong to
    another build and drain or terminate them (:func:`_other_builds`). A failure
    here is said, never fatal: the process still polls its version."""
    from aiworker.workers.process import deployments as deployments

    try:
        await deployments.ensure_current(client, settings)
        if other_builds is not None:
            await _other_builds(client, settings, other_builds)
    except Exception as e:
        deployments.log.warning(
            "deployment.settle_failed",
            extra={"aiworker": {"event": "deployment_settle_failed", "error": str(e)}},
        )
        print(f"aiworker: worker deployment: {e}", file=sys.stderr, flush=True)
    finally:
        if on_ready:
            on_ready()


async def _other_builds(
    client: Client, settings: Settings, what: Literal["drain", "terminate"]
) -> None:
    """Say which running pinned runs of this deployment belong to another build
    (the code before an edit): a pinned run replays only on its own build's
    workers, so this process never runs them. ``drain`` leaves them waiting for a
    worker of their build; ``terminate`` ends them."""
    from aiworker.workers.process import deployments as deployments

    runs = await deployments.other_build_runs(client, settings)
    if not runs:
        return
    shown = ", ".join(f"{r.workflow_id} ({r.workflow_type}, build {r.build_id})" for r in runs[:5])
    shown += ", ..." if len(runs) > 5 else ""
    if what == "terminate":
        ended = await deployments.terminate_runs(
            client,
            runs,
            f"aiworker dev --terminate-other-builds: build {deployments.build_id(settings)}",
        )
        print(
            f"aiworker: terminated {ended} run(s) of other builds: {shown}",
            file=sys.stderr,
            flush=True,
        )
        return
    print(
        f"aiworker: {len(runs)} running run(s) belong to other builds and wait for a worker "
        f"of their build (this build, {deployments.build_id(settings)}, never replays them): "
        f"{shown}; "
        "run their build's code to let them finish, or restart with "
        "`aiworker dev --terminate-other-builds` to terminate them",
        file=sys.stderr,
        flush=True,
    )


@dataclass(frozen=True)
class DevOptions:
    """How ``aiworker dev`` / ``demo`` runs its stack.

    Attributes:
        port: the Temporal frontend port.
        ui_port: the Web UI port; ``None`` for no UI.
        fast_poll: lower idle latency at some cost of peak throughput.
        exit_after_pipeline: stop the stack once the pipeline ended (``demo --exit``).
        json_result: print the pipeline's whole result JSON, not its progress and
            a summary table (``demo --json``).
        local_model: start the local model as the ``default`` alias when no model
            is configured (``--no-model`` turns it off, as ``AIWORKER_LOCAL_MODEL=false``).
        site_port: serve the bundled sample site on this loopback port (0: any
            free one; ``dev --site``); ``None`` serves none.
        terminate_other_builds: terminate the running runs of other builds of
            this deployment at start instead of leaving them to drain
            (``dev --terminate-other-builds``).
    """

    port: int = 7233
    ui_port: int | None = 8233
    fast_poll: bool = False
    exit_after_pipeline: bool = False
    json_result: bool = False
    local_model: bool = True
    site_port: int | None = None
    terminate_other_builds: bool = False


def dev_log_file(data_dir: Path) -> IO[str]:
    """The dev stack's worker log (the terminal shows only what a person needs)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return open(data_dir / "worker.log", "a")


async def run_dev_stack(
    settings: Settings,
    options: DevOptions,
    pipeline: dict[str, Any] | None = None,
    *,
    bundled_demo: bool = False,
) -> dict[str, Any] | None:
    """Run the dev stack until Ctrl-C (or, with ``exit_after_pipeline``, the pipeline's end).

    Args:
        settings: the stack's settings (``settings.data_dir`` holds the server's database).
        options: ports and modes.
        pipeline: a checked pipeline to start once the worker polls.
        bundled_demo: serve the bundled sample site and point the pipeline at it.

    Returns:
        The pipeline's outcome document (printed as it arrived), or ``None``
        when no pipeline ran to its end.

    Raises:
        DevServerError: the server cannot start (data directory in use, port taken),
            or the local model cannot start or stopped (``ModelServerError``).
        StartupError: the worker cannot start.
    """
    from aiworker.workers.client.temporal_client import TemporalUnreachableError, connect
    from aiworker.workers.devstack import state
    from aiworker.workers.devstack.demo_site import DemoSite
    from aiworker.workers.devstack.devserver import DevServer, DevServerError
    from aiworker.workers.devstack.modelserver import (
        ModelServer,
        end_watch,
        gguf_file,
        model_configured,
        with_local_model,
    )
    from aiworker.workers.process.telemetry import Telemetry

    telemetry = Telemetry()
    server = DevServer(
        settings.data_dir,
        port=options.port,
        ui_port=options.ui_port,
        fast_poll=options.fast_poll,
    )
    model: ModelServer | None = None
    if options.local_model and settings.local_model and not model_configured(settings):
        chosen = settings.local_model_file
        model = ModelServer(
            settings.data_dir / "model-server.log",
            model=gguf_file(chosen) if chosen is not None else None,  # refused before any start
        )
    elif settings.local_model_file is not None:
        print(
            "aiworker: AIWORKER_LOCAL_MODEL_FILE is not used: the local model is off "
            "(--no-model, AIWORKER_LOCAL_MODEL=false) or a `default` model is configured",
            file=sys.stderr,
            flush=True,
        )
    stop = asyncio.Event()
    outcome = None
    async with contextlib.AsyncExitStack() as stack:
        sample_site = None
        if options.site_port is not None:  # a busy port is said before anything starts
            try:
                sample_site = DemoSite(options.site_port).start()
            except OSError as e:
                raise DevServerError(
                    f"cannot serve the sample site on port {options.site_port}: {e.strerror}; "
                    "choose another with --site PORT (0: any free port)"
                ) from None
            stack.callback(sample_site.stop)
        if model is not None:
            # Loads while the Temporal server starts; ready-checked once that is up.
            stack.callback(model.stop)
            model.spawn()
        stack.enter_context(server)
        if model is not None:
            await asyncio.to_thread(model.wait_ready)
            settings = with_local_model(settings, model)
            stack.push_async_callback(end_watch, asyncio.create_task(model.watch(stop)))
        # The port accepts connections before the frontend can serve: wait for health.
        try:
            client = await connect(
                target_host=server.address,
                namespace="default",
                telemetry=telemetry,
                settings=settings,
                wait_seconds=CONNECT_WAIT_SECONDS,
            )
        except TemporalUnreachableError as e:
            raise DevServerError(f"{e}; the server's log is {server.log_path}") from None
        worker = await stack.enter_async_context(
            _background_worker(settings, client, stop, telemetry, options.terminate_other_builds)
        )
        # A worker that ended before it polled failed to start, or was stopped starting.
        if not worker.done():
            recorded = state.record(
                settings.data_dir,
                address=server.address,
                namespace=client.namespace,
                ui_url=server.ui_url,
                server_pid=server.pid,
                site_url=sample_site.url if sample_site is not None else None,
                worker_env=dev_worker_env(settings, model),
            )
            stack.callback(state.forget, recorded)
            _announce(server.address, server.ui_url, settings.data_dir)
            if sample_site is not None:
                print(
                    f"Sample site:     {sample_site.url}/ (workers/samples/site, e.g. "
                    f"{sample_site.url}/kettle.html)",
                    flush=True,
                )
            _say_other_terminals(recorded)
            if model is not None:
                print(
                    f"Local model:     {model.base_url} (default alias {model.model_name}; "
                    f"llama-server pid {model.pid}; --no-model turns it off)",
                    flush=True,
                )
            if pipeline is not None and bundled_demo:
                site = DemoSite().start()
                stack.callback(site.stop)
                pipeline = _point_at_demo_site(pipeline, site.url, settings)
            if pipeline is not None:
                outcome = await _run_pipeline(
                    client, settings, server.ui_url, pipeline, stop, worker, options.json_result
                )
                if bundled_demo and outcome is not None and not options.json_result:
                    _say_summary(outcome)
                if options.exit_after_pipeline:
                    stop.set()
            if not stop.is_set() and not worker.done():
                print("Press Ctrl-C to stop.", flush=True)
        await worker
    return outcome


def _say_summary(outcome: dict[str, Any]) -> None:
    """The demo's LLM summary: what the model said, or why it did not."""
    step = (outcome.get("steps") or {}).get("summary") or {}
    outputs = step.get("outputs") or {}
    if step.get("status") in ("succeeded", "partial") and isinstance(outputs.get("text"), str):
        text = " ".join(outputs["text"].split())
        cut = " [cut at max_tokens]" if outputs.get("finish_reason") == "length" else ""
        print(f"LLM summary:     {text}{cut}", flush=True)
    elif step.get("status") not in (None, "skipped"):
        why = step.get("error_code") or step.get("status")
        print(f"LLM summary:     {why}: {step.get('error_message') or ''}".rstrip(), flush=True)


@contextlib.asynccontextmanager
async def _background_worker(
    settings: Settings,
    client: Client,
    stop: asyncio.Event,
    telemetry: Telemetry,
    terminate_other_builds: bool = False,
) -> AsyncIterator[asyncio.Task[None]]:
    """This process as a worker of every queue, running beside the caller's code.

    Yields the worker's task once it polls (or has already ended); on the way
    out, sets ``stop`` and waits for the drain, bounded by the grace period.
    """
    ready = asyncio.Event()
    # The dev stack is one process: its build takes every new run; the open runs of
    # the code before an edit stay on their build (said, drained or terminated).
    task = asyncio.create_task(
        run_worker_process(
            settings.model_copy(update={"deployment_current": "always"}),
            [],
            client=client,
            stop=stop,
            on_ready=ready.set,
            telemetry=telemetry,
            other_builds="terminate" if terminate_other_builds else "drain",
        )
    )
    try:
        ready_wait = asyncio.create_task(ready.wait())
        await asyncio.wait([task, ready_wait], return_when=asyncio.FIRST_COMPLETED)
        ready_wait.cancel()
        yield task
    finally:
        stop.set()
        done, _ = await asyncio.wait(
            [task], timeout=settings.shutdown_grace_seconds + _DRAIN_MARGIN_SECONDS
        )
        if not done:
            task.cancel()
            await asyncio.wait([task])
        elif not task.cancelled():
            # Leaving on another error: that one is reported, not the worker's.
            task.exception()


# The model settings go together: a worker that names any of them chose its models.
_MODEL_VARIABLES = (
    "AIWORKER_LLM_PROVIDER",
    "AIWORKER_LLM_BASE_URL",
    "AIWORKER_LLM_MODEL",
    "AIWORKER_LLM_API_KEY",
    "AIWORKER_MODELS_FILE",
)


def dev_worker_env(settings: Settings, model: ModelServer | None) -> dict[str, str]:
    """What the dev stack's worker has beyond a plain ``aiworker worker``'s defaults,
    as variables (recorded in ``dev.json`` for :func:`join_dev_stack`): loopback
    and private addresses allowed, and the local model as the ``default`` alias."""
    env = {"AIWORKER_ALLOW_PRIVATE_NETWORKS": str(settings.allow_private_networks).lower()}
    if model is not None:
        env |= {
            "AIWORKER_LLM_PROVIDER": "openai",
            "AIWORKER_LLM_BASE_URL": model.base_url,
            "AIWORKER_LLM_MODEL": model.model_name,
        }
    return env


def join_dev_stack(
    environ: Mapping[str, str], *, profile: str | None = None, address: str | None = None
) -> tuple[dict[str, str], str | None]:
    """The environment of an ``aiworker worker`` that connects to the live dev stack
    of its data directory: the stack's worker settings (:func:`dev_worker_env`)
    under ``environ``'s own, and one line saying so; ``environ`` unchanged and
    ``None`` for a worker of any other server.

    A variable set in ``environ`` wins over the stack's; the model settings go as a
    group (a worker that names any model setting keeps its own models).
    """
    from aiworker.workers.client.temporal_client import (
        default_data_dir,
        resolve_target,
        shown_path,
    )
    from aiworker.workers.devstack import state

    data_dir = Path(environ["AIWORKER_DATA_DIR"]) if environ.get("AIWORKER_DATA_DIR") else None
    place = data_dir if data_dir is not None else default_data_dir()
    stack, _ = state.find(place)
    if stack is None or not stack.worker_env:
        return dict(environ), None
    target = resolve_target(profile, data_dir=place, target_host=address)
    if target.config.get("target_host") != stack.address:
        return dict(environ), None
    own_models = any(environ.get(name) for name in _MODEL_VARIABLES)
    taken = {
        name: value
        for name, value in stack.worker_env.items()
        if not environ.get(name) and not (own_models and name in _MODEL_VARIABLES)
    }
    if not taken:
        return dict(environ), None
    settings = ", ".join(f"{name}={value}" for name, value in taken.items())
    line = (
        f"this worker joins the aiworker dev stack at {stack.address} "
        f"(from {shown_path(place / state.STATE_FILE)}) and takes its dev settings: {settings} "
        "(set a variable to choose otherwise)"
    )
    return {**taken, **environ}, line


def _announce(address: str, ui_url: str | None, data_dir: Path) -> None:
    """Where the stack runs: what a person opens or reads next."""
    print(f"Temporal server: {address}   (data: {data_dir})", flush=True)
    if ui_url:
        print(f"Temporal UI:     {ui_url}", flush=True)
    print(f"Worker polling:  all task queues; logs in {data_dir / 'worker.log'}", flush=True)


def _say_other_terminals(recorded: state.DevStack) -> None:
    """The line a second terminal needs: nothing in this folder (its clients read
    ``dev.json``), the profile file elsewhere and for the ``temporal`` CLI."""
    here = Path(recorded.data_dir) == (Path.cwd() / ".aiworker").resolve()
    who = "in this folder" if here else f"with AIWORKER_DATA_DIR={recorded.data_dir}"
    print(
        f"Other terminals: aiworker commands and scripts run {who} use this stack by themselves;",
        flush=True,
    )
    print(
        "                 elsewhere, and for the temporal CLI: "
        f"export TEMPORAL_CONFIG_FILE={recorded.profile_path}",
        flush=True,
    )
    # A server chosen in the shell wins over the stack (temporal_client.resolve_target).
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_CONFIG_FILE", "TEMPORAL_PROFILE"):
        value = os.environ.get(name)
        if value and value not in (recorded.address, str(recorded.profile_path)):
            print(
                f"Note:            {name}={value} is set in this shell; commands run with it "
                "use what it names, not this stack",
                flush=True,
            )


def _point_at_demo_site(
    pipeline: dict[str, Any], site_url: str, settings: Settings
) -> dict[str, Any]:
    """The bundled demo pipeline, pointed at the sample site on loopback."""
    from aiworker.workers.devstack.modelserver import model_configured

    print(f"Sample site:     {site_url} (bundled, served on loopback)", flush=True)
    llm_enabled = model_configured(settings)
    if not llm_enabled:
        print(
            "LLM summary:     skipped (no model: the local one is off; set "
            "AIWORKER_LLM_BASE_URL and AIWORKER_LLM_MODEL to use another)",
            flush=True,
        )
    inputs = {**pipeline.get("inputs", {}), "site_url": site_url, "llm_enabled": llm_enabled}
    return {**pipeline, "inputs": inputs}


async def _run_pipeline(
    client: Client,
    settings: Settings,
    ui_url: str | None,
    pipeline: dict[str, Any],
    stop: asyncio.Event,
    worker: asyncio.Task[None],
    json_result: bool = False,
) -> dict[str, Any] | None:
    """Start ``pipeline`` and show it (progress, then a summary table; with
    ``json_result`` the result JSON), unless the stack stops first."""
    from aiworker.workers.client.client import PipelineClient
    from aiworker.workers.client.progress import workflow_link
    from aiworker.workers.client.watch import show_run

    pipelines = PipelineClient(client, settings)
    # the command read it with read_pipeline, which checked it
    handle = await pipelines.start(pipeline, check=False)
    print(f"Started pipeline {pipeline['name']}: workflow id {handle.id}", flush=True)
    link = workflow_link(ui_url, client.namespace, handle.id)
    if link:
        print(f"  {link}", flush=True)
    if json_result:
        outcome = asyncio.create_task(pipelines.outcome(handle.id, handle.result_run_id))
    else:
        # `demo` takes no --field: a cut output field points at --json
        outcome = asyncio.create_task(show_run(pipelines, handle, pipeline, link, hint="--json"))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([outcome, stopped, worker], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not outcome.done():
        outcome.cancel()
        return None
    doc = outcome.result()
    if json_result:
        print_outcome(doc)
    else:
        warn_duplicates(doc)
    return doc
