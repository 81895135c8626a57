"""One span for every client-side ``aiworker`` command, with its outcome.

:func:`command_span` wraps the dispatch in :func:`aiworker.workers.cli.main.main`,
so every command a person types (``check``, ``list``, ``review``, ``redrive``,
``workers``, ``schedule ...``, and any command added later) is a span named
``aiworker <command>[ <action>]`` with ``aiworker.command``,
``aiworker.action``, ``process.exit.code`` and ``aiworker.outcome`` (``ok``,
``failed``, ``usage``, ``not_found``, ``interrupted``), its status an error
when the exit code is not 0. A command that opens its own span (``run``,
``review``, ``redrive``: :func:`~aiworker.workers.cli.common.cli_span`) opens it
under this one, and the SDK's tracing interceptor carries the same trace into
the workflow. The tracer provider is the one the other processes use
(:func:`~aiworker.workers.process.telemetry.tracer_provider_from_env`, the
standard ``OTEL_*`` variables, ``service.name`` ``aiworker-cli``), flushed
before the command returns (the process then ends with ``os._exit``).

The long-running processes (``worker``, ``dev``, ``demo``, ``serve``) are left
out: they build their own telemetry with their own ``service.name``, and a
span that lasts a process's life tells an operator nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator

# Commands that are processes with telemetry of their own, not one-shot clients.
PROCESS_COMMANDS = frozenset({"worker", "dev", "demo", "serve"})

SERVICE_NAME = "aiworker-cli"

_OUTCOMES = {0: "ok", 1: "failed", 2: "usage", 3: "not_found", 130: "interrupted"}


def span_name(args: argparse.Namespace) -> str:
    """``aiworker <command>``, plus the subcommand's action where it has one."""
    action = _action(args)
    return f"aiworker {args.command}" + (f" {action}" if action else "")


def _action(args: argparse.Namespace) -> str | None:
    for dest in ("action", "keys_action"):
        value = getattr(args, dest, None)
        if isinstance(value, str):
            return value
    return None


def _exit_code(code: object) -> int:
    if isinstance(code, int):
        return code
    return 0 if code is None else 1


@contextlib.contextmanager
def command_span(args: argparse.Namespace) -> Iterator[Callable[[int], int]]:
    """The command's span; call what it yields with the exit code (it returns it).

    A ``SystemExit`` leaving the command is recorded with its code, a
    ``KeyboardInterrupt`` as 130; both propagate unchanged.
    """
    if args.command in PROCESS_COMMANDS:
        yield lambda code: code
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Status, StatusCode

    from aiworker.workers.process.telemetry import (
        install_tracer_provider,
        tracer_provider_from_env,
    )

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        provider = install_tracer_provider(tracer_provider_from_env(os.environ, SERVICE_NAME))
    tracer = provider.get_tracer("aiworker.cli")
    attributes = {"aiworker.command": args.command}
    action = _action(args)
    if action:
        attributes["aiworker.action"] = action
    outcome: list[int] = []

    def record(code: int) -> int:
        outcome.append(code)
        return code

    try:
        with tracer.start_as_current_span(
            span_name(args),
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield record
            except SystemExit as e:
                record(_exit_code(e.code))
                raise
            except KeyboardInterrupt:
                record(130)
                raise
            except BaseException as e:
                span.set_attribute("error.type", type(e).__name__)
                record(1)
                raise
            finally:
                code = outcome[-1] if outcome else 1
                span.set_attribute("process.exit.code", code)
                span.set_attribute("aiworker.outcome", _OUTCOMES.get(code, "failed"))
                if code != 0:
                    span.set_status(Status(StatusCode.ERROR, f"exit code {code}"))
    finally:
        if isinstance(provider, TracerProvider):
            provider.force_flush(5_000)
