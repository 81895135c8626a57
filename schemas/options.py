"""Temporal activity options derived from a worker spec, in one place.

No call site writes a timeout or retry policy by hand: workflows call
:func:`activity_options` and splat the result into ``execute_activity``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from temporalio.common import RetryPolicy

from aiworker.schemas.errors import NON_RETRYABLE_CODES
from aiworker.schemas.protocol import RequestConstraints
from aiworker.schemas.spec import WorkerSpec

# Temporal's own start-to-close timeout sits a little past the worker's own
# deadline, so that the worker reports `timeout` with context first and the
# server's timeout only catches a worker that is stuck or gone.
_GRACE_SECONDS = 5.0

# A local activity's retry that waits this long or less waits in the worker, inside
# the workflow task; a longer backoff becomes a durable timer in the history, so a
# worker restart does not lose the wait and the workflow task is not held for it.
LOCAL_RETRY_THRESHOLD = timedelta(seconds=5)


class ActivityOptions(TypedDict):
    """Keyword arguments for ``workflow.execute_activity``."""

    task_queue: str
    start_to_close_timeout: timedelta
    schedule_to_start_timeout: timedelta | None
    heartbeat_timeout: timedelta | None
    retry_policy: RetryPolicy


def retry_policy(spec: WorkerSpec, max_attempts: int | None = None) -> RetryPolicy:
    """The retry policy of a spec; ``max_attempts`` may only lower the spec's."""
    r = spec.retries
    attempts = r.max_attempts if max_attempts is None else min(max_attempts, r.max_attempts)
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=r.initial_interval_ms),
        backoff_coefficient=2.0 if r.backoff == "exponential" else 1.0,
        maximum_interval=timedelta(milliseconds=r.max_interval_ms),
        maximum_attempts=attempts,
        non_retryable_error_types=list(NON_RETRYABLE_CODES),
    )


def effective_timeout(spec: WorkerSpec, constraints: RequestConstraints | None = None) -> float:
    """The worker's own deadline in seconds for one attempt."""
    t = spec.constraints.timeout_seconds
    if constraints is not None and constraints.timeout_seconds is not None:
        t = min(t, constraints.timeout_seconds)
    return t


def activity_options(
    spec: WorkerSpec,
    *,
    constraints: RequestConstraints | None = None,
    max_attempts: int | None = None,
    queue_suffix: str = "",
    schedule_to_start_seconds: float | None = None,
) -> ActivityOptions:
    """Activity options for one call of the worker ``spec`` describes.

    ``schedule_to_start_seconds`` bounds how long the call may wait in its task
    queue for a worker to poll it (an external worker nobody runs); without it
    the call waits until a worker comes.
    """
    timeout = effective_timeout(spec, constraints)
    return ActivityOptions(
        task_queue=spec.task_queue + queue_suffix,
        start_to_close_timeout=timedelta(seconds=timeout + _GRACE_SECONDS),
        schedule_to_start_timeout=(
            None
            if schedule_to_start_seconds is None
            # a server reads a zero duration as "unset": keep a positive bound
            else timedelta(seconds=max(schedule_to_start_seconds, 0.001))
        ),
        heartbeat_timeout=(
            timedelta(seconds=spec.heartbeat_seconds) if spec.heartbeat_seconds else None
        ),
        retry_policy=retry_policy(spec, max_attempts),
    )


# A lease outlives the calls it covers by this much (signal and scheduling latency).
_LEASE_MARGIN_SECONDS = 60.0


def lease_seconds(spec: WorkerSpec, timeout: float | None, max_attempts: int | None) -> float:
    """How long one call of ``spec`` may hold a concurrency lease: every attempt
    at its full timeout plus the longest backoff between attempts, and a margin.

    The limiter asks the holder before it takes an expired lease back, so this
    bounds how long a vanished holder keeps a slot, not how long a call may run.
    """
    policy = retry_policy(spec, max_attempts)
    attempts = policy.maximum_attempts or 1
    per_attempt = (timeout or spec.constraints.timeout_seconds) + _GRACE_SECONDS
    backoff = (policy.maximum_interval or timedelta()).total_seconds()
    return attempts * per_attempt + (attempts - 1) * backoff + _LEASE_MARGIN_SECONDS
