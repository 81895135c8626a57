"""AWS Lambda entry point: a bounded worker for one task queue (default ``aiworker-llm``).

Built on ``temporalio.contrib.aws.lambda_worker``: each invocation connects to
Temporal (``temporalio.envconfig``: ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, TLS, or ``temporal.toml`` in the function root), polls the
queue until the invocation deadline minus a shutdown buffer, then stops polling,
lets running activities finish within ``AIWORKER_SHUTDOWN_GRACE_SECONDS`` and
returns. A schedule (deploy/lambda/template.yaml) invokes it again, so some
function is always polling while tasks wait.

Timeouts stay predictable because they nest: the function timeout is longer
than the polling window plus the drain, and the drain is longer than the
longest activity's start-to-close timeout. Logs are the same JSON lines as a
worker pod's, on stderr (CloudWatch).

The Lambda worker always uses Worker Deployment Versioning: the function's
``AIWORKER_DEPLOYMENT_NAME`` and ``AIWORKER_BUILD_ID`` (default: the Lambda
function version) name its version, and that version must be made current
(``temporal worker deployment set-current-version``) before it receives tasks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.aws.lambda_worker import LambdaWorkerConfig, run_worker

from aiworker.activities.metrics import WorkerMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names

# Room after the worker's drain for the SDK's shutdown hooks and the response.
SHUTDOWN_HOOK_BUFFER = timedelta(seconds=2)

LambdaHandler = Callable[[Any, Any], None]


class LambdaConfigError(RuntimeError):
    """The function's settings cannot run a worker; the message says which."""


def lambda_queue(settings: Settings) -> str:
    """The base task queue this function polls: ``AIWORKER_TASK_QUEUES`` or llm."""
    if len(settings.task_queues) > 1:
        raise LambdaConfigError(
            "AIWORKER_TASK_QUEUES: a Lambda worker polls one task queue, got "
            + ", ".join(settings.task_queues)
        )
    return settings.task_queues[0] if settings.task_queues else names.LLM_QUEUE


def deployment_version(settings: Settings, env: Mapping[str, str]) -> WorkerDeploymentVersion:
    """The Worker Deployment version of this function."""
    build_id = settings.build_id or env.get("AWS_LAMBDA_FUNCTION_VERSION")
    if not build_id:
        raise LambdaConfigError(
            "AIWORKER_BUILD_ID is not set and there is no AWS_LAMBDA_FUNCTION_VERSION"
        )
    return WorkerDeploymentVersion(deployment_name=settings.deployment_name, build_id=build_id)


def make_handler(env: Mapping[str, str] | None = None) -> LambdaHandler:
    """Build the Lambda handler from ``env`` (default: the process environment).

    Settings are validated here, at cold start, so a typo fails the first
    invocation with the variable's name instead of a task later.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from aiworker.workers.client.temporal_client import data_converter
    from aiworker.workers.process.resources import build_runtime
    from aiworker.workers.process.task_queues import activities_for
    from aiworker.workers.process.telemetry import install_tracer_provider, tracer_provider_from_env
    from aiworker.workers.process.worker import load_process_workers

    env = os.environ if env is None else env
    settings = Settings.from_env(env)
    queue = lambda_queue(settings)
    version = deployment_version(settings, env)
    # Metrics are not scraped in Lambda, but the runtime records them; one
    # private registry per process keeps warm invocations from re-registering.
    metrics = WorkerMetrics(CollectorRegistry())
    grace = timedelta(seconds=settings.shutdown_grace_seconds)
    # Plugins and spec files load once, at cold start (a broken one fails it).
    served = load_process_workers(settings)
    # Activity attempts join the trace of the pipeline that scheduled them
    # (OTLP export from the standard OTEL_* variables, as in a worker pod).
    provider = install_tracer_provider(tracer_provider_from_env(env, "aiworker-lambda"))
    tracing = TracingInterceptor(provider.get_tracer("temporalio.contrib.opentelemetry"))

    def flush_spans() -> None:
        # A frozen Lambda sandbox would hold batched spans until the next invocation.
        if isinstance(provider, TracerProvider):
            provider.force_flush(2000)

    def configure(config: LambdaWorkerConfig) -> None:
        # Per invocation, inside its event loop: the tools' HTTP clients bind to it.
        runtime = build_runtime(settings, metrics, workers=served)
        activities = activities_for(queue, runtime, served)
        if not activities:
            raise LambdaConfigError(f"no activities are implemented for task queue {queue!r}")
        config.client_connect_config.setdefault("target_host", "localhost:7233")
        config.client_connect_config["data_converter"] = data_converter(None)
        config.worker_config["task_queue"] = settings.queue(queue)
        config.worker_config["activities"] = activities
        # tracing first: each call's telemetry span sits in its RunActivity span
        config.worker_config["interceptors"] = [tracing, runtime.interceptor()]
        config.shutdown_hooks.append(flush_spans)
        config.worker_config["graceful_shutdown_timeout"] = grace
        config.shutdown_deadline_buffer = grace + SHUTDOWN_HOOK_BUFFER

    return run_worker(version, configure)


_handler: LambdaHandler | None = None


def lambda_handler(event: Any, context: Any) -> None:
    """The function's handler (``workers.process.lambda_handler.lambda_handler``)."""
    global _handler
    if _handler is None:
        from aiworker.workers.process.logs import configure_logging

        settings = Settings.from_env(os.environ)
        configure_logging(settings.log_level, settings.secret_values())
        _handler = make_handler()
    _handler(event, context)
