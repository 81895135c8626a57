"""What the ``aiworker`` commands share: exit codes, the one-line error, settings,
logs, a command's root span and reading and checking a pipeline file.

Exit codes are part of the command line's contract (docs/cli.md, and
tests/workers/test_cli_exit_codes.py runs each): 0 done (a pipeline that
succeeded), 1 failed (a pipeline that did not succeed, Temporal unreachable, a
refused review, an unexpected error), 2 bad usage (a bad file, flag, setting or
plugin, a pipeline that cannot be redriven), 3 not found (no workflow,
schedule, deployment or build with that id; nothing recorded), 130 Ctrl-C. How
errors map to them: :mod:`aiworker.workers.cli.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from aiworker.config.catalog import Catalog
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.problems import Problem

if TYPE_CHECKING:
    from temporalio.client import Client

    from aiworker.workers.client.client import PipelineClient
    from aiworker.workers.process.live_registry import WorkerView
    from aiworker.workers.process.telemetry import Telemetry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3  # the workflow (or schedule) id names nothing in the namespace
EXIT_INTERRUPTED = 130  # stopped with Ctrl-C: 128 + SIGINT, as shells report it


def err(msg: str) -> None:
    """Print ``aiworker: msg`` on stderr: one line a person reads."""
    print(f"aiworker: {msg}", file=sys.stderr)


def positive_int(value: str) -> int:
    """A whole number of at least 1, for ``argparse``."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment; exits 2 naming the variable on error.

    A command reads the environment's settings once (:func:`command_settings`);
    this reads them anew on every call, for ``env`` mappings of its own."""
    try:
        return Settings.from_env(os.environ if env is None else env)
    except SettingsError as e:
        err(f"invalid settings: {e}")
        raise SystemExit(EXIT_USAGE) from None


def command_settings(args: argparse.Namespace) -> Settings:
    """The command's settings: read from the environment at its first use and kept
    on ``args`` for the rest of the command, so that each part of it (the check,
    the connection, the catalog, the logs) sees the same object and the
    environment is read once; exits 2 naming the variable on error."""
    settings = getattr(args, "_settings", None)
    if not isinstance(settings, Settings):
        settings = load_settings()
        args._settings = settings
    return settings


async def command_client(args: argparse.Namespace, wait: float | None = None) -> Client:
    """The command's one Temporal connection: made at its first use (``--profile``,
    ``--address``, the command's settings; within ``wait`` seconds when given) and
    kept on ``args``, so that every part of a command (the live registry's view,
    the history it reads, what it starts) shares it.

    Raises:
        TemporalUnreachableError: the frontend did not answer.
        TimeoutError: not within ``wait``.
    """
    client = getattr(args, "_client", None)
    if client is None:
        from aiworker.workers.client.temporal_client import connect

        made = connect(
            getattr(args, "profile", None),
            target_host=getattr(args, "address", None),
            settings=command_settings(args),
        )
        client = await (asyncio.wait_for(made, wait) if wait is not None else made)
        args._client = client
    return client


def dev_settings(command: str, data_dir: str | None) -> Settings:
    """Settings for ``aiworker dev`` / ``demo``: the environment's, with local defaults."""
    env = dict(os.environ)
    env.setdefault("AIWORKER_ALLOW_PRIVATE_NETWORKS", "true")
    if command == "demo":
        # the seed's 10/min per tenant would make a second demo run within a
        # minute wait; the demo tenant may scrape the bundled site faster
        env.setdefault("AIWORKER_RATE_LIMITS", "web-scrape:demo=120/min")
    if data_dir:
        env["AIWORKER_DATA_DIR"] = data_dir
    if not env.get("AIWORKER_REGISTRY_SECRET"):
        # the stack's registry is signed with a secret of its own, kept in its data
        # dir, where the commands beside it (same data dir) read it
        from aiworker.config.settings import REGISTRY_SECRET_FILE
        from aiworker.workers.devstack.state import ensure_registry_secret

        ensure_registry_secret(
            Path(env.get("AIWORKER_DATA_DIR") or ".aiworker"), REGISTRY_SECRET_FILE
        )
    return load_settings(env)


def configure_logs(settings: Settings, stream: IO[str] | None = None) -> None:
    """JSON logs at the configured level, with every known secret redacted."""
    from aiworker.workers.process.logs import configure_logging
    from aiworker.workers.process.telemetry import otlp_header_secrets

    configure_logging(
        settings.log_level,
        [*settings.secret_values(), *otlp_header_secrets(os.environ)],
        stream=stream,
    )


def start_worker_process(settings: Settings, stream: IO[str] | None = None) -> None:
    """What a process that runs a worker (``worker``, ``dev``, ``demo``) does first:
    its logs, then its malloc arena bound, before the Temporal runtime's threads
    exist (:mod:`aiworker.workers.devstack.arenas`)."""
    from aiworker.workers.devstack.arenas import bound_malloc_arenas

    configure_logs(settings, stream)
    bound_malloc_arenas(settings.malloc_arenas)


@contextlib.asynccontextmanager
async def cli_span(name: str, **attributes: str) -> AsyncIterator[Telemetry]:
    """Telemetry for one CLI command: the root span of what it starts or changes
    (the SDK's tracing interceptor carries it into the workflow), ended and
    exported, with the process's S3 connections closed, when the command ends."""
    from opentelemetry import trace

    from aiworker.workers.process.resources import close_connections
    from aiworker.workers.process.telemetry import Telemetry

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


@contextlib.asynccontextmanager
async def pipelines_session(
    args: argparse.Namespace, span: str, **attributes: str
) -> AsyncIterator[PipelineClient]:
    """A command's :class:`~aiworker.workers.client.client.PipelineClient` inside its root
    span (:func:`cli_span`), with the environment's settings (so it reads the
    external payload storage and the artifact store the workers write) and JSON
    logs; ``args`` carries ``--profile`` and ``--address``."""
    from aiworker.workers.client.client import PipelineClient

    settings = command_settings(args)
    configure_logs(settings)
    async with cli_span(span, **attributes) as telemetry:
        pipelines = await PipelineClient.connect(
            args.profile, target_host=args.address, settings=settings, telemetry=telemetry
        )
        args._client = pipelines.temporal  # the command's one connection (command_client)
        yield pipelines


def process_catalog(settings: Settings) -> Catalog:
    """Every worker this process would know as a worker process (built-ins, plugins,
    spec files), installed; exits 2 naming a broken plugin or spec file."""
    from aiworker.workers.errors import StartupError
    from aiworker.workers.process.worker import load_process_workers

    try:
        return load_process_workers(settings).catalog
    except StartupError as e:
        err(str(e))
        raise SystemExit(EXIT_USAGE) from None


def load_pipeline_file(path: str) -> Any:
    """A pipeline file's JSON (``-`` for stdin), unchecked; exit 2 with the reason."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as e:
        err(f"cannot read {path}: {e.strerror}")
        raise SystemExit(EXIT_USAGE) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        err(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}")
        raise SystemExit(EXIT_USAGE) from None
    except RecursionError:  # the decoder recurses per level of nesting
        err(f"{path}: invalid pipeline (invalid_input): JSON nested too deep to read")
        raise SystemExit(EXIT_USAGE) from None


def local_view(reason: str, settings: Settings) -> WorkerView:
    """The workers this process would know as a worker process (spec files,
    installed plugins), as the view a pipeline is checked against."""
    from aiworker.workers.process.live_registry import WorkerView

    return WorkerView(process_catalog(settings).specs, "local", reason)


async def command_view(args: argparse.Namespace, say: str | None = None) -> WorkerView:
    """The workers a command checks a pipeline against: the live registry's when
    Temporal answers (within a few seconds) and the registry lists a process,
    else the local specs with the reason (``--local`` asks for them). Loads no
    plugin and no worker code when the registry answers. With ``say``, says
    which on stderr (``<say> the live registry (3 processes)``); a line for
    each registry entry it ignored in any case. It reads through the command's
    one connection (:func:`command_client`)."""
    from aiworker.workers.process.live_registry import READ_TIMEOUT_SECONDS, resolve_view

    settings = command_settings(args)
    if getattr(args, "local", False):
        view = local_view("--local", settings)
    else:
        profile, address = getattr(args, "profile", None), getattr(args, "address", None)
        try:
            client = await command_client(args, wait=READ_TIMEOUT_SECONDS)
        except Exception as e:  # unreachable, slow, or a bad profile: check offline
            view = local_view(no_answer(e, profile, address), settings)
        else:
            view = await resolve_view(
                client,
                settings,
                lambda: process_catalog(settings).specs,
                read_timeout=READ_TIMEOUT_SECONDS,
            )
    for warning in view.warnings:
        err(f"warning: {warning}")
    if say is not None:
        err(f"{say} {view.describe()}")
    return view


def no_answer(e: Exception, profile: str | None, address: str | None) -> str:
    """Why a command could not reach Temporal, in a few words."""
    from aiworker.workers.client.temporal_client import connect_config
    from aiworker.workers.process.live_registry import READ_TIMEOUT_SECONDS

    try:
        target = connect_config(profile, target_host=address)["target_host"]
    except Exception as bad:  # a broken envconfig profile
        return f"Temporal settings unusable: {str(bad)[:160]}"
    text = str(e)
    if isinstance(e, TimeoutError):
        why = f"no answer within {READ_TIMEOUT_SECONDS:g}s"
    elif "ConnectionRefused" in text or "Connection refused" in text:
        why = "connection refused"
    else:
        why = (text.splitlines()[0] if text else type(e).__name__)[:160]
    return f"Temporal at {target} did not answer: {why}"


def pipeline_problems(
    raw: Any, settings: Settings, view: WorkerView | None = None
) -> list[Problem]:
    """Every problem of a pipeline as this process would start it: the spec under
    ``view``'s workers (this process's when omitted), caps, model aliases and
    tenants (one code path for ``check`` and ``run``); empty when it may start."""
    from aiworker.activities.llm import ModelsFileError
    from aiworker.schemas.pipeline_check import PipelineSpecError

    try:
        (view or local_view("", settings)).check(raw, settings)
    except PipelineSpecError as e:
        return e.details
    except ModelsFileError as e:
        err(f"invalid settings: {e}")
        raise SystemExit(EXIT_USAGE) from None
    return []


async def check_pipeline_file(args: argparse.Namespace) -> int:
    """``aiworker check``: print ``ok: <file> (<n> steps)``, or one line per problem
    (``<file>: step 'a': field 'input.url': ...``), or (``--json``) the problems as
    a JSON list of ``{step, field, path, message, suggestion}``; the exit code.
    Which workers it checked against is one line on stderr."""
    path, as_json = args.file, args.json
    raw = load_pipeline_file(path)
    view = await command_view(args, say="checked against")
    problems = pipeline_problems(raw, command_settings(args), view)
    if as_json:
        print(json.dumps([p.to_json() for p in problems], indent=2, ensure_ascii=False))
    elif problems:
        for p in problems:
            print(f"{path}: {p}")
    else:
        n = len(raw["steps"])
        print(f"ok: {path} ({n} step{'' if n == 1 else 's'})")
    return EXIT_USAGE if problems else EXIT_OK


def read_pipeline(path: str, settings: Settings) -> dict[str, Any]:
    """Read and check a pipeline file (``-`` for stdin) against this process's
    workers; exit 2 with one line per problem."""
    return checked_pipeline(load_pipeline_file(path), path, settings, None)


def checked_pipeline(
    raw: Any, path: str, settings: Settings, view: WorkerView | None
) -> dict[str, Any]:
    """``raw`` (read from ``path``) when it passes the check against ``view``'s
    workers (this process's when None); exit 2 with one line per problem, then
    (with a view) one saying what it was checked against. A pipeline that
    passes adds nothing: ``run --json`` keeps stderr empty."""
    problems = pipeline_problems(raw, settings, view)
    for p in problems:
        err(f"{path}: {p}")
    if problems and view is not None:
        err(f"checked against {view.describe()}")
    if problems or not isinstance(raw, dict):
        raise SystemExit(EXIT_USAGE)
    return raw


async def read_checked_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`read_pipeline` of ``args.file`` against :func:`command_view`'s workers
    (``run``, ``schedule create``)."""
    raw = load_pipeline_file(args.file)  # a bad file is refused before connecting
    return checked_pipeline(raw, args.file, command_settings(args), await command_view(args))


def outcome_code(doc: Mapping[str, Any]) -> int:
    """The exit code of a pipeline's outcome: 0 when it succeeded, else 1."""
    return EXIT_OK if doc.get("status") == "succeeded" else EXIT_FAILED


def print_outcome(doc: Mapping[str, Any]) -> int:
    """Print a pipeline's outcome JSON on stdout, and on stderr a line for each
    step that published nothing because its key was already done (its
    ``duplicate`` warning); returns its :func:`outcome_code`."""
    print(json.dumps(doc, indent=2, ensure_ascii=False), flush=True)
    warn_duplicates(doc)
    return outcome_code(doc)


def warn_duplicates(doc: Mapping[str, Any]) -> None:
    """On stderr, a line for each step of an outcome that published nothing because
    its key was already done (its ``duplicate`` warning)."""
    steps = doc.get("steps")
    for sid, step in (steps if isinstance(steps, dict) else {}).items():
        for w in step.get("warnings") or () if isinstance(step, dict) else ():
            if isinstance(w, dict) and w.get("code") == "duplicate":
                err(f"step {sid!r}: {w.get('message')}")
